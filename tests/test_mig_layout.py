"""The MIG layout planner: NVIDIA's placement rules, sizing from memory, mig-parted output."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infertune.api.tuning import MigSpec, MigStrategy
from infertune.tuning.mig import (
    Infeasible,
    LayoutPlan,
    MemoryRequest,
    MigProduct,
    ProfileRequest,
    SliceRequest,
    load_catalog,
    memory_need,
    plan_layout,
    request_from_spec,
)
from infertune.tuning.migparted import config_name, render_mig_parted_config

A100 = "NVIDIA-A100-SXM4-40GB"
GIB = 2**30


def _parse(layout: str) -> tuple[tuple[str, int], ...]:
    """`2x3g.20gb+1g.5gb` as the planner's (profile, count) pairs."""
    pairs = []
    for part in layout.replace("+me", "~me").split("+"):
        count, _, profile = part.rpartition("x")
        pairs.append((profile.replace("~me", "+me"), int(count or 1)))
    return tuple(pairs)


# reference/mig.md "Worked cases", checked against the User Guide's placement rules.
@pytest.mark.parametrize("layout", [
    "7x1g.5gb", "2x3g.20gb", "4g.20gb+3g.20gb", "3x2g.10gb+1g.5gb", "3g.20gb+2x2g.10gb",
    "4g.20gb+2g.10gb+1g.5gb", "4g.20gb+3x1g.5gb", "4x1g.10gb", "7g.40gb",
    "3x2g.10gb+1g.10gb", "6x1g.5gb+1g.10gb", "3g.20gb+4x1g.5gb", "1g.5gb+me+6x1g.5gb",
])
def test_valid_a100_layouts_are_placed(layout: str) -> None:
    assert isinstance(plan_layout(A100, SliceRequest(_parse(layout))), LayoutPlan)


@pytest.mark.parametrize(("layout", "reason"), [
    ("2x4g.20gb", "2x4g.20gb: at most 1 instance of 4g.20gb per GPU"),
    ("2x3g.20gb+1g.5gb", "2x3g.20gb + 1g.5gb: memory slices exhausted"),
    ("7g.40gb+1g.5gb", "needs 8 compute slices, NVIDIA-A100-SXM4-40GB has 7"),
    ("5x1g.10gb", "at most 4 instances of 1g.10gb per GPU"),
    ("8x1g.5gb", "at most 7 instances of 1g.5gb per GPU"),
    ("2x1g.5gb+me", "at most 1 instance of 1g.5gb+me"),
    ("4g.20gb+2x2g.10gb", "needs 8 compute slices"),
    ("3g.71gb", "3g.71gb does not exist on NVIDIA-A100-SXM4-40GB; valid: 1g.5gb, 1g.5gb+me, "
                "1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb"),
])
def test_invalid_a100_layouts_are_refused_with_the_rule_they_break(layout: str,
                                                                  reason: str) -> None:
    result = plan_layout(A100, SliceRequest(_parse(layout)))
    assert isinstance(result, Infeasible)
    assert reason in result.reason


def test_one_gig_instances_never_start_at_the_eighth_slice() -> None:
    # 1g.5gb starts only at 0..6: beside 3g.20gb four of them fit only if 3g.20gb takes 4-7.
    plan = plan_layout(A100, SliceRequest(_parse("3g.20gb+4x1g.5gb")))
    assert isinstance(plan, LayoutPlan)
    assert [(i.profile, i.start) for i in plan.instances] == [
        ("1g.5gb", 0), ("1g.5gb", 1), ("1g.5gb", 2), ("1g.5gb", 3), ("3g.20gb", 4)]


def test_a30_allows_one_media_extension_instance_in_total() -> None:
    both = plan_layout("NVIDIA-A30", SliceRequest((("1g.6gb+me", 1), ("2g.12gb+me", 1))))
    assert isinstance(both, Infeasible) and "at most one +me" in both.reason
    assert isinstance(plan_layout("NVIDIA-A30", SliceRequest((("2g.12gb+me", 1),
                                                              ("2g.12gb", 1)))), LayoutPlan)


def test_gpus_without_mig_are_refused_by_name() -> None:
    result = plan_layout("NVIDIA-L4", ProfileRequest("1g.5gb"))
    assert isinstance(result, Infeasible)
    assert result.reason.startswith("NVIDIA-L4 does not support MIG")


def test_unknown_products_list_the_known_ones() -> None:
    result = plan_layout("NVIDIA-H300", ProfileRequest("1g.5gb"))
    assert isinstance(result, Infeasible) and "known: NVIDIA-A100-SXM4-40GB" in result.reason


def test_the_plan_gives_each_instance_its_nvidia_start_slice() -> None:
    plan = plan_layout("NVIDIA-H200", SliceRequest((("3g.71gb", 1), ("2g.35gb", 2))))
    assert isinstance(plan, LayoutPlan)
    # 2g.35gb starts only at 0, 2, 4: with 3g.71gb at 0 the second one would need slice 6.
    assert [(i.profile, i.start, i.width) for i in plan.instances] == [
        ("2g.35gb", 0, 2), ("2g.35gb", 2, 2), ("3g.71gb", 4, 4)]
    assert plan.pod_profile == "3g.71gb"
    assert plan.slices == (("3g.71gb", 1), ("2g.35gb", 2))


def test_plans_name_the_catalog_product_for_an_alias() -> None:
    plan = plan_layout("NVIDIA-H200-NVL", ProfileRequest("3g.71gb"))
    assert isinstance(plan, LayoutPlan) and plan.product == "NVIDIA-H200"


@pytest.mark.parametrize(("product", "profile", "count"), [
    ("NVIDIA-H200", "3g.71gb", 2), ("NVIDIA-H200", "2g.35gb", 3), ("NVIDIA-H200", "1g.18gb", 7),
    ("NVIDIA-A100-SXM4-80GB", "1g.20gb", 4), ("NVIDIA-A30", "2g.12gb", 2),
    ("NVIDIA-A30", "1g.6gb+me", 1), ("NVIDIA-B200", "7g.180gb", 1),
])
def test_a_profile_alone_fills_the_gpu(product: str, profile: str, count: int) -> None:
    plan = plan_layout(product, ProfileRequest(profile))
    assert isinstance(plan, LayoutPlan)
    assert plan.slices == ((profile, count),)


@pytest.mark.parametrize(("product", "weights", "kv", "headroom", "profile"), [
    # Qwen2-7B bf16: (15 + 10) GiB x 1.1 = 27.5 GiB = 29.5e9 bytes; 1g.35gb holds 35e9.
    ("NVIDIA-H200", 15 * GIB, 10 * GIB, 0.1, "1g.35gb"),
    ("NVIDIA-H200", 40 * GIB, 20 * GIB, 0.1, "3g.71gb"),
    ("NVIDIA-A100-SXM4-40GB", 4 * GIB, 0, 0.1, "1g.5gb"),
    # 4.7e9 x 1.1 is above 1g.5gb's 5e9 floor: the next size up, with one compute slice.
    ("NVIDIA-A100-SXM4-40GB", 4_700_000_000, 0, 0.1, "1g.10gb"),
    ("NVIDIA-H100-80GB-HBM3", 60 * GIB, 0, 0.2, "7g.80gb"),
])
def test_sizing_picks_the_smallest_profile_that_holds_the_model(
    product: str, weights: int, kv: int, headroom: float, profile: str
) -> None:
    plan = plan_layout(product, MemoryRequest(memory_need(weights, kv, headroom)))
    assert isinstance(plan, LayoutPlan)
    assert plan.pod_profile == profile
    assert all(i.profile == profile for i in plan.instances)


def test_sizing_beyond_the_largest_profile_names_it() -> None:
    result = plan_layout("NVIDIA-A100-SXM4-80GB", MemoryRequest(150 * GIB))
    assert isinstance(result, Infeasible)
    assert result.reason == ("model needs 150 GiB but the largest profile on "
                             "NVIDIA-A100-SXM4-80GB is 7g.80gb (80 GB)")


def test_sizing_with_a_layout_needs_the_chosen_profile_in_it() -> None:
    need = memory_need(40 * GIB, 20 * GIB, 0.1)
    inside = plan_layout("NVIDIA-H200", MemoryRequest(need, (("3g.71gb", 1), ("2g.35gb", 2))))
    assert isinstance(inside, LayoutPlan) and inside.pod_profile == "3g.71gb"
    outside = plan_layout("NVIDIA-H200", MemoryRequest(need, (("2g.35gb", 3),)))
    assert isinstance(outside, Infeasible) and outside.reason.endswith(
        "and no profile of layout 3x2g.35gb does; put 3g.71gb or a larger one in the layout, "
        "or leave layout empty"), outside.reason


@pytest.mark.parametrize(("product", "need_gib", "layout", "pod"), [
    ("NVIDIA-A100-SXM4-40GB", 8, (("2g.10gb", 3), ("1g.5gb", 1)), "2g.10gb"),
    ("NVIDIA-H200", 30, (("3g.71gb", 1), ("2g.35gb", 2)), "2g.35gb"),
    ("NVIDIA-H200", 40, (("3g.71gb", 1), ("2g.35gb", 2)), "3g.71gb"),
])
def test_sizing_with_a_layout_takes_its_smallest_profile_that_holds_the_model(
        product: str, need_gib: int, layout: tuple[tuple[str, int], ...], pod: str) -> None:
    """The smallest profile of the whole catalog was required in the layout: 8 GiB beside
    3x2g.10gb + 1g.5gb asked for a 1g.10gb, which would not have fitted beside them."""
    plan = plan_layout(product, MemoryRequest(need_gib * GIB, layout))
    assert isinstance(plan, LayoutPlan), plan
    assert plan.pod_profile == pod
    assert f"{pod} (" in plan.reason and "smallest profile of the layout" in plan.reason


def test_strategy_single_refuses_mixed_layouts() -> None:
    result = plan_layout("NVIDIA-H200", SliceRequest((("3g.71gb", 1), ("2g.35gb", 2)),
                                                     strategy=MigStrategy.SINGLE))
    assert isinstance(result, Infeasible) and "strategy single" in result.reason


@pytest.mark.parametrize(("spec", "expected"), [
    ({"profile": "3g.71gb"}, ProfileRequest("3g.71gb")),
    ({"profile": "3g.71gb", "layout": [{"profile": "3g.71gb"},
                                       {"profile": "2g.35gb", "count": 2}]},
     SliceRequest((("3g.71gb", 1), ("2g.35gb", 2)), "3g.71gb")),
    ({"sizing": {"weights": "10Gi", "kvCache": "10Gi", "headroomRatio": 0.5}},
     MemoryRequest(30 * GIB)),
])
def test_requests_follow_the_spec(spec: dict[str, object], expected: object) -> None:
    assert request_from_spec(MigSpec.model_validate(spec)) == expected


# --- property: the planner agrees with a brute-force reading of NVIDIA's placement rules ------

PROPERTY_PRODUCTS = ["NVIDIA-A100-SXM4-40GB", "NVIDIA-H200", "NVIDIA-A30", "NVIDIA-B200"]


def _brute_force_valid(gpu: MigProduct, counts: Counter[str]) -> bool:
    """Every choice of start slices, checked rule by rule; no search order, no pruning."""
    profiles = {p.name: p for p in gpu.profiles}
    if any(n > profiles[p].max_instances for p, n in counts.items()):
        return False
    if sum(n for p, n in counts.items() if profiles[p].media_extensions) > 1:
        return False
    if sum(profiles[p].compute_slices * n for p, n in counts.items()) > gpu.compute_slices:
        return False
    choices = [itertools.combinations(profiles[p].placements, n) for p, n in counts.items()]
    for starts in itertools.product(*choices):
        used: list[int] = []
        for (p, _), chosen in zip(counts.items(), starts, strict=True):
            for start in chosen:
                used.extend(range(start, start + profiles[p].memory_slices))
        if len(used) == len(set(used)) and max(used, default=0) < gpu.memory_slices:
            return True
    return False


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[str, Counter[str]]:
    product = draw(st.sampled_from(PROPERTY_PRODUCTS))
    gpu = load_catalog().lookup(product)
    assert isinstance(gpu, MigProduct)
    names = draw(st.lists(st.sampled_from(gpu.profile_names), min_size=1, max_size=9))
    return product, Counter(names)


@settings(max_examples=400, deadline=None)
@given(_layouts())
def test_planner_agrees_with_brute_force_placement(case: tuple[str, Counter[str]]) -> None:
    product, counts = case
    gpu = load_catalog().lookup(product)
    assert isinstance(gpu, MigProduct)
    result = plan_layout(product, SliceRequest(tuple(counts.items())))
    assert isinstance(result, LayoutPlan) == _brute_force_valid(gpu, counts), result
    if isinstance(result, LayoutPlan):
        assert Counter(i.profile for i in result.instances) == counts
        used = [s for i in result.instances for s in range(i.start, i.start + i.width)]
        assert len(used) == len(set(used))
        profiles = {p.name: p for p in gpu.profiles}
        assert all(i.start in profiles[i.profile].placements for i in result.instances)


# --- mig-parted config ---------------------------------------------------------------------------


def test_config_has_mig_parted_shape_and_the_reset_entry() -> None:
    plan = plan_layout("NVIDIA-H200", SliceRequest((("2g.35gb", 2), ("3g.71gb", 1))))
    assert isinstance(plan, LayoutPlan)
    name = config_name(plan.product, plan)
    assert render_mig_parted_config({name: plan}) == {
        "version": "v1",
        "mig-configs": {
            "all-disabled": [{"devices": "all", "mig-enabled": False}],
            "infertune-h200-1x3g.71gb-2x2g.35gb": [{
                "devices": "all", "mig-enabled": True,
                "mig-devices": {"3g.71gb": 1, "2g.35gb": 2}}],
        },
    }


def test_per_gpu_layouts_group_gpus_with_the_same_devices() -> None:
    config = render_mig_parted_config(
        {"split": [{"1g.5gb": 7}, {"1g.5gb": 7}, {"3g.20gb": 2}]}, include_all_disabled=False)
    assert config["mig-configs"] == {"split": [
        {"devices": [0, 1], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}},
        {"devices": [2], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}]}


def test_a_config_name_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="all-disabled"):
        render_mig_parted_config({"all-disabled": {"1g.5gb": 7}})


@pytest.mark.parametrize(("product", "layout", "name"), [
    ("NVIDIA-H200", {"2g.35gb": 2, "3g.71gb": 1}, "infertune-h200-1x3g.71gb-2x2g.35gb"),
    ("NVIDIA-A100-SXM4-40GB", {"1g.5gb+me": 1}, "infertune-a100-sxm4-40gb-1x1g.5gb.me"),
    ("NVIDIA-A30", {"1g.6gb": 2, "2g.12gb": 1}, "infertune-a30-1x2g.12gb-2x1g.6gb"),
])
def test_config_names_are_stable_and_label_safe(product: str, layout: dict[str, int],
                                                name: str) -> None:
    assert config_name(product, layout) == name
    assert config_name(product, dict(reversed(layout.items()))) == name


def test_long_config_names_are_cut_to_63_characters_with_a_hash() -> None:
    layout = {"1g.5gb": 3, "1g.5gb+me": 1, "2g.10gb": 1, "1g.10gb": 1}
    name = config_name("NVIDIA-A100-SXM4-40GB", layout)
    assert len(name) <= 63 and name[-1].isalnum()
    assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789.-")
    assert name != config_name("NVIDIA-A100-SXM4-40GB", {**layout, "1g.5gb": 2})

"""The packaged MIG catalog agrees with NVIDIA's MIG User Guide and resolves GFD product names."""

from __future__ import annotations

import pytest

from infertune.tuning.mig import (
    LayoutPlan,
    MemoryRequest,
    MigProduct,
    NonMigProduct,
    catalog_from_mapping,
    load_catalog,
    plan_layout,
)

# MIG User Guide, "Supported MIG Profiles" (and the GPU Operator config for GB200).
GUIDE_PROFILES = {
    "NVIDIA-A100-SXM4-40GB": "1g.5gb 1g.5gb+me 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb",
    "NVIDIA-A100-SXM4-80GB": "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb",
    "NVIDIA-H100-80GB-HBM3": "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb",
    "NVIDIA-H100-NVL": "1g.12gb 1g.12gb+me 1g.24gb 2g.24gb 3g.47gb 4g.47gb 7g.94gb",
    "NVIDIA-H200": "1g.18gb 1g.18gb+me 1g.35gb 2g.35gb 3g.71gb 4g.71gb 7g.141gb",
    "NVIDIA-B200": "1g.23gb 1g.23gb+me 1g.45gb 2g.45gb 3g.90gb 4g.90gb 7g.180gb",
    "NVIDIA-GB200": "1g.23gb 1g.23gb+me 1g.47gb 2g.47gb 3g.93gb 4g.93gb 7g.186gb",
    "NVIDIA-A30": "1g.6gb 1g.6gb+me 2g.12gb 2g.12gb+me 4g.24gb",
}

# The guide's "Number of Instances Available" column, and lgipp's {starts}:width.
EIGHT_SLICE = {1: (7, (0, 1, 2, 3, 4, 5, 6), 1), 2: (3, (0, 2, 4), 2), 3: (2, (0, 4), 4),
               4: (1, (0,), 4), 7: (1, (0,), 8)}


@pytest.mark.parametrize(("product", "names"), GUIDE_PROFILES.items())
def test_profiles_are_the_ones_the_mig_user_guide_lists(product: str, names: str) -> None:
    gpu = load_catalog().lookup(product)
    assert isinstance(gpu, MigProduct)
    assert gpu.profile_names == tuple(names.split())


@pytest.mark.parametrize("product", [p for p in GUIDE_PROFILES if p != "NVIDIA-A30"])
def test_eight_slice_products_use_the_nvidia_smi_placement_table(product: str) -> None:
    gpu = load_catalog().lookup(product)
    assert isinstance(gpu, MigProduct)
    assert (gpu.memory_slices, gpu.compute_slices) == (8, 7)
    for profile in gpu.profiles:
        if profile.memory_slices == 2 and profile.compute_slices == 1:  # 1g.10gb on A100-40GB
            assert (profile.max_instances, profile.placements) == (4, (0, 2, 4, 6))
            continue
        max_instances, starts, width = EIGHT_SLICE[profile.compute_slices]
        if profile.media_extensions:
            max_instances = 1
        assert (profile.max_instances, profile.placements, profile.memory_slices) == (
            max_instances, starts, width), profile.name


def test_a30_has_four_slices_and_two_media_extension_profiles() -> None:
    gpu = load_catalog().lookup("NVIDIA-A30")
    assert isinstance(gpu, MigProduct)
    assert (gpu.memory_slices, gpu.compute_slices) == (4, 4)
    table = {p.name: (p.max_instances, p.placements, p.memory_slices) for p in gpu.profiles}
    assert table == {"1g.6gb": (4, (0, 1, 2, 3), 1), "1g.6gb+me": (1, (0, 1, 2, 3), 1),
                     "2g.12gb": (2, (0, 2), 2), "2g.12gb+me": (1, (0, 2), 2),
                     "4g.24gb": (1, (0,), 4)}


def test_every_placement_stays_on_the_gpu() -> None:
    for gpu in load_catalog().products:
        for profile in gpu.profiles:
            assert all(s >= 0 and s + profile.memory_slices <= gpu.memory_slices
                       for s in profile.placements), (gpu.product, profile.name)


def test_profile_names_match_their_sizes_and_bytes() -> None:
    for gpu in load_catalog().products:
        for p in gpu.profiles:
            assert p.name == f"{p.compute_slices}g.{p.memory_gb}gb" + ("+me" * p.media_extensions)
            # Sizing never counts on more than the driver reports, where that is published.
            limit = p.memory_gb * 10**9 if p.reported_gib is None else p.reported_gib * 2**30
            assert p.memory_bytes <= limit


@pytest.mark.parametrize(("product", "need_gib", "chosen"), [
    # 16.00 GiB is what the driver gives 1g.18gb (mig-parted #120); a byte more needs 1g.35gb.
    ("NVIDIA-H200", 16.0, "1g.18gb"),
    ("NVIDIA-H200", 16.0 + 2**-30, "1g.35gb"),
    ("NVIDIA-H100-NVL", 10.8, "1g.24gb"),  # 1g.12gb is 10.75 GiB (gpu-operator #900)
    ("NVIDIA-A100-SXM4-80GB", 9.3, "1g.10gb"),  # no lgip published: the name's 10e9 bytes
])
def test_a_model_is_sized_on_what_the_driver_reports(product: str, need_gib: float,
                                                     chosen: str) -> None:
    plan = plan_layout(product, MemoryRequest(int(need_gib * 2**30)))
    assert isinstance(plan, LayoutPlan), plan
    assert plan.pod_profile == chosen


@pytest.mark.parametrize(("label", "product"), [
    ("NVIDIA-H200", "NVIDIA-H200"),
    ("NVIDIA-H200-NVL", "NVIDIA-H200"),
    ("NVIDIA-A100-80GB-PCIe", "NVIDIA-A100-SXM4-80GB"),
    ("NVIDIA-A100-PCIE-40GB", "NVIDIA-A100-SXM4-40GB"),
    ("NVIDIA-H100-PCIe", "NVIDIA-H100-80GB-HBM3"),
    ("nvidia-h100-80gb-hbm3", "NVIDIA-H100-80GB-HBM3"),
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "NVIDIA-A100-SXM4-40GB"),  # GFD under strategy single
    ("NVIDIA-H100-80GB-HBM3-SHARED", "NVIDIA-H100-80GB-HBM3"),  # GFD with time-slicing
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED", "NVIDIA-A100-SXM4-40GB"),  # both
    (" NVIDIA-A30 ", "NVIDIA-A30"),
])
def test_gfd_product_strings_and_aliases_resolve(label: str, product: str) -> None:
    found = load_catalog().lookup(label)
    assert found is not None and found.product == product


@pytest.mark.parametrize("label", ["NVIDIA-A10", "NVIDIA-A10G", "NVIDIA-L4", "NVIDIA-L40S",
                                   "Tesla-T4", "Tesla-V100-SXM2-32GB", "NVIDIA-L4-SHARED"])
def test_gpus_without_mig_are_known_as_such(label: str) -> None:
    assert isinstance(load_catalog().lookup(label), NonMigProduct)


def test_unknown_products_are_not_guessed() -> None:
    assert load_catalog().lookup("NVIDIA-H300") is None


def test_catalog_is_read_once() -> None:
    assert load_catalog() is load_catalog()


def test_a_product_listed_twice_is_refused() -> None:
    raw = {"geometries": {"g": {"memory_slices": 1, "compute_slices": 1, "shapes": {
        "1g": {"compute": 1, "memory_slices": 1, "max_instances": 1, "placements": [0]}}}},
        "products": {"GPU-A": {"aliases": ["GPU-B"], "geometry": "g", "memory_gb": {"1g": 1}}},
        "without_mig": {"gpu-b": []}}
    with pytest.raises(ValueError, match="listed twice"):
        catalog_from_mapping(raw)

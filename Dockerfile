# The operator image: `infertune run` (operator and webhook), and the launcher that the init
# container copies into serving pods.
FROM python:3.11-slim
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin infertune
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY operator ./operator
RUN pip install --no-cache-dir -c constraints.txt . && rm -rf /src
WORKDIR /
USER 65532
ENTRYPOINT ["infertune"]
CMD ["run", "--all-namespaces"]

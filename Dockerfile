# rampmeter sidecar image: slim Python, non-root, and the same `rampmeter serve`
# command line as docs/deployment.md and examples/kubernetes/deployment.yaml.
#   docker build -t rampmeter .
#   docker run --rm -p 8080:8080 -p 9090:9090 rampmeter
# Ports: data 8080 (listen.address), admin 9090 (/healthz /readyz /metrics).
# Installs only what `serve` needs: the sidecar extra, and redis for dedup.store = "redis"
# (a mounted policy may ask for it). No plots, no load tester (pyproject.toml's extras).

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY client_sdk ./client_sdk
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[sidecar,redis]'

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels 'rampmeter[sidecar,redis]' \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin rampmeter
# A default policy (the Kubernetes example's); a ConfigMap mounted on /etc/rampmeter replaces it.
COPY examples/kubernetes/policy.toml examples/kubernetes/probe-long.json /etc/rampmeter/
USER 10001:10001
EXPOSE 8080 9090
ENTRYPOINT ["rampmeter"]
CMD ["serve", "--policy", "/etc/rampmeter/policy.toml", "--listen", "0.0.0.0:8080", "--admin", "0.0.0.0:9090"]

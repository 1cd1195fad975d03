# voxpipe container image: see README.md, "Install and deploy".
#
#   docker build --build-arg VOXPIPE_COMMIT=$(git rev-parse --short HEAD) -t voxpipe .   (or: make docker)
#   docker run -d --name voxpipe -p 8080:8080 -p 50000:50000/udp \
#     -e VOXPIPE_API_KEYS=$(openssl rand -hex 16) -v voxpipe-data:/data -v /srv/models:/models:ro \
#     voxpipe serve --listen 0.0.0.0:8080 --udp-port 50000 --voices /data/voices --public-ip HOST_IP
#
# Build stage: Go with the -dev packages of the C libraries the cgo code links (the same list
# as the Makefile's BUILD_PKGS).
FROM golang:1.26-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libopus-dev libopusfile-dev libopenblas-dev libmp3lame-dev pkg-config gcc libvulkan-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# .git is not sent (.dockerignore): the commit `voxpipe version` prints comes from this argument.
ARG VOXPIPE_COMMIT=unknown
RUN go build -trimpath -buildvcs=false -ldflags "-s -w -X main.buildCommit=${VOXPIPE_COMMIT}" \
      -o /out/voxpipe ./cmd/voxpipe \
 && /out/voxpipe version

# Runtime stage: only the shared libraries the binary loads (ldd bin/voxpipe: libopus,
# libopusfile (+ libogg), OpenBLAS (pthread variant, + libgfortran), libmp3lame) and CA
# certificates for outgoing TLS (TURN over TLS, obs-websocket over wss). libvulkan1 is the
# Vulkan loader the binary opens at run time when there is a GPU (its driver comes from the
# host, e.g. the NVIDIA container toolkit); without one the models run on the CPU.
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libopus0 libopusfile0 libopenblas0-pthread libmp3lame0 libvulkan1 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --home-dir /data --no-create-home \
      --shell /usr/sbin/nologin voxpipe \
 && mkdir -p /data /models \
 && chown voxpipe:voxpipe /data
COPY --from=build /out/voxpipe /usr/local/bin/voxpipe

# /data: the voice library (/data/voices: uploaded clips and the speaker-embedding cache) and,
# with --tls-self-signed, the certificate (/data/tls). Keep it on a volume.
# /models: GGUF model files, mounted read-only (e.g. --vc-model /models/meanvc2.gguf).
# XDG_DATA_HOME: a command line without --voices still keeps its library in the volume
# (/data/voxpipe/voices).
VOLUME ["/data"]
ENV HOME=/data XDG_DATA_HOME=/data
USER voxpipe:voxpipe
WORKDIR /data

# 8080/tcp: HTTP (page, signaling, API, /healthz, /metrics).
# 50000/udp: all WebRTC media when serving with --udp-port 50000 (publish it with
# -p 50000:50000/udp and advertise the host's address with --public-ip).
EXPOSE 8080/tcp 50000/udp

# /healthz needs no API key. bash's /dev/tcp keeps curl out of the image; it assumes the
# default plain-HTTP listener on port 8080 (adjust or disable when CMD changes the port or
# serves TLS).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080 && printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && grep -q '\"status\":\"ok\"' <&3"]

ENTRYPOINT ["/usr/local/bin/voxpipe"]
# A non-loopback --listen needs API keys (16 characters or more): pass VOXPIPE_API_KEYS (and
# VOXPIPE_ADMIN_KEYS) with -e or --env-file, or the server refuses to start.
CMD ["serve", "--listen", "0.0.0.0:8080", "--udp-port", "50000", "--voices", "/data/voices"]

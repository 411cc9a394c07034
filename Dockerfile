# Build stage. rust:1-bookworm already has what the native dependencies need:
# rdkafka-sys builds the bundled librdkafka with its ./configure and make and
# links the system OpenSSL (libssl-dev, pkg-config) and zlib (zlib1g-dev);
# libmimalloc-sys compiles the mimalloc allocator with the C compiler.
FROM rust:1-bookworm AS builder
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin outbox-sidecar

# Runtime stage: Debian slim rather than distroless/cc because the binary links
# libz.so.1 (from zlib1g, present here), next to libssl3, which is added along
# with the CA bundle used for TLS to Kafka and to the receivers.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 65532 nonroot \
 && useradd --system --uid 65532 --gid nonroot --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin nonroot
COPY --from=builder /src/target/release/outbox-sidecar /usr/local/bin/outbox-sidecar

LABEL org.opencontainers.image.title="outbox-sidecar" \
      org.opencontainers.image.description="Drives a transactional outbox from Debezium change events on Kafka to HTTP receivers" \
      org.opencontainers.image.licenses="Apache-2.0"

# Numeric, so that Kubernetes' runAsNonRoot can verify it without a passwd lookup.
USER 65532:65532
# Admin port: /metrics, /livez, /readyz and the admin API.
EXPOSE 9464
ENTRYPOINT ["outbox-sidecar"]
CMD ["run", "--config", "/etc/outbox-sidecar/config.toml"]

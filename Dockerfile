# Baton's image: built from source in a Rust stage, run from a minimal non-root stage.
#
#   docker build -t baton:0.1.0 .
#
# The runtime stage is distroless "cc" (glibc, libgcc and CA certificates, no shell, no package
# manager) as user 65532. The binary is stripped of debug information; the image is about 14 MB
# uncompressed. The test suite builds the same image without Docker (tests/python/test_image.py).

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src src
COPY benches benches
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin baton \
 && strip --strip-debug -o /baton target/release/baton

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /baton /baton
USER 65532:65532
ENTRYPOINT ["/baton"]
CMD ["serve", "--listen", "0.0.0.0:50051"]

# Baton's image: built from source in a Rust stage, run from scratch as a non-root user.
#
#   docker build -t baton:0.1.0 .
#
# The runtime stage holds the binary, stripped of debug information, and exactly the shared
# libraries it maps (glibc's, libgcc_s), copied from the build stage: no shell, no package
# manager, about 16 MB uncompressed. The test suite builds the same image without Docker and
# checks it (tests/python/test_image.py).

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src src
COPY benches benches
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin baton \
 && mkdir -p /out \
 && strip --strip-debug -o /out/baton target/release/baton \
 && for lib in $(ldd /out/baton | grep -o '/[^ ]*'); do \
      mkdir -p "/out$(dirname "$lib")" && cp -L "$lib" "/out$lib"; \
    done

FROM scratch
COPY --from=build /out/ /
# distroless's "nonroot" user; the Helm chart runs Baton as this user too.
USER 65532:65532
ENTRYPOINT ["/baton"]
CMD ["serve", "--listen", "0.0.0.0:50051"]

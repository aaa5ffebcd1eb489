#!/usr/bin/env bash
# Builds the client packages as users get them and tests them against live Batons (the real
# binary, a private redis-server): clients/python (an sdist, a wheel built from the sdist alone,
# an editable install) with pytest, blocking and asyncio; clients/node (the tarball `npm pack`
# makes, installed into a scratch project) with Node's own test runner. Their dependencies come
# from PyPI and the npm registry, installed into .tools/py and clients/node/node_modules. Then the
# root buf.gen.yaml is run with Debian's protoc and plugins (apt-get when missing) into a scratch
# directory, to check that the Go, Java and C# generation it documents works and lands where the
# proto files' options say.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

repo=$PWD
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# The binary as the test suite builds it (every workspace target, one feature set), so that
# scripts/test.sh compiles the dependencies once for this and for `cargo test`.
cargo build --locked --workspace --all-targets
export BATON_BIN="$PWD/target/debug/baton"

echo "==> Python package (clients/python)"
venv=.tools/py
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
if ! "$py" -c "import build, grpc_tools, grpc_health, pytest, pytest_asyncio, yaml, google.rpc.status_pb2" 2>/dev/null \
  || ! "$py" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)"; then
  "$py" -m pip install -q --disable-pip-version-check \
    "setuptools>=77" "build>=1.2" "grpcio-tools>=1.70,<2" "grpcio-health-checking>=1.70,<2" \
    "googleapis-common-protos>=1.66,<2" "pytest>=8" "pytest-asyncio>=0.24" "pyyaml>=6"
fi
# An editable install generates the stubs into src/: they import from outside the checkout.
"$py" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e ./clients/python
(cd "$scratch" && "$repo/$py" -c "import baton.v1.election_pb2, baton.aio; assert baton.__file__.startswith('$repo/clients/python/src/')")
# The package as an index serves it: an sdist (carrying its copy of proto/), then a wheel built
# from that sdist alone (`python -m build` does both, with the build tools above); the tests run
# against the wheel's install.
"$py" -m build --no-isolation --outdir "$scratch/py" clients/python >"$scratch/py-build.log" 2>&1 \
  || { cat "$scratch/py-build.log"; exit 1; }
"$py" - "$scratch"/py/baton_client-*.tar.gz "$scratch"/py/baton_client-*.whl <<'EOF'
import sys, tarfile, zipfile
sdist, wheel = sys.argv[1:3]
names = tarfile.open(sdist).getnames()
assert any(n.endswith("/proto/baton/v1/election.proto") for n in names), names
files = zipfile.ZipFile(wheel).namelist()
for want in ("baton/py.typed", "baton/v1/election_pb2.py", "baton/v1/election_pb2.pyi",
             "baton/v1/election_pb2_grpc.py", "baton/v1/__init__.py"):
    assert want in files, (want, files)
EOF
"$py" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$scratch"/py/baton_client-*.whl
(cd clients/python && "$repo/$py" -m pytest -p no:cacheprovider -q tests)

echo "==> Node package (clients/node)"
# The Node that scripts/install-deps.sh installed when the machine's was older than 20.
if [ -x .tools/node/bin/node ]; then
  export PATH="$PWD/.tools/node/bin:$PATH"
fi
# `npm install` rather than `npm ci`: it installs what package-lock.json pins as well, but does
# not refuse a lock that lacks the other platforms' optional buf binaries (npm records only the
# platform it ran on).
(cd clients/node && npm install --no-audit --no-fund --loglevel=error)
# `npm pack` builds the package (prepack: generate, compile) and packs what a registry would
# serve; the tests then run on that build (--ignore-scripts: no second build).
(cd clients/node && npm pack --silent --pack-destination "$scratch" >/dev/null && npm test --ignore-scripts)
# The tarball installs and imports in a project of its own (its dependencies from npm's cache).
mkdir "$scratch/node-app"
(cd "$scratch/node-app" \
  && echo '{"name": "app", "private": true, "type": "module"}' > package.json \
  && npm install --prefer-offline --no-audit --no-fund --loglevel=error "$scratch"/baton-client-*.tgz \
  && test -f node_modules/@baton/client/dist/src/index.d.ts \
  && test ! -e node_modules/@baton/client/dist/test \
  && node --input-type=module -e '
import { Baton, Leadership, LeaseLostError, pb } from "@baton/client";
for (const [what, value] of Object.entries({ Baton, Leadership, LeaseLostError, ElectionService: pb.ElectionService, BadRequestSchema: pb.BadRequestSchema })) {
  if (value === undefined) throw new Error(`@baton/client exports no ${what}`);
}
Baton.connect("127.0.0.1:1").close();
')

echo "==> Generating Go, Java and C# from proto/ (buf.gen.yaml)"
need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v grpc_java_plugin >/dev/null 2>&1 || need+=(protobuf-compiler-grpc-java-plugin)
command -v protoc-gen-go >/dev/null 2>&1 || need+=(protoc-gen-go)
command -v protoc-gen-go-grpc >/dev/null 2>&1 || need+=(protoc-gen-go-grpc)
if [ ${#need[@]} -gt 0 ]; then
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Debian names grpc-java's plugin grpc_java_plugin; buf.gen.yaml uses the name Maven Central's has.
mkdir "$scratch/bin"
ln -s "$(command -v grpc_java_plugin)" "$scratch/bin/protoc-gen-grpc-java"
# Every block of buf.gen.yaml, as written, but grpc_csharp_plugin's (NuGet only).
"$py" - buf.gen.yaml "$scratch/buf.gen.yaml" <<'EOF'
import sys, yaml
template = yaml.safe_load(open(sys.argv[1]))
template["plugins"] = [p for p in template["plugins"] if p.get("local") != "grpc_csharp_plugin"]
names = [p.get("local") or p.get("protoc_builtin") for p in template["plugins"]]
assert names == ["protoc-gen-go", "protoc-gen-go-grpc", "java", "protoc-gen-grpc-java", "csharp"], names
yaml.safe_dump(template, open(sys.argv[2], "w"))
EOF
PATH="$scratch/bin:$PATH" .tools/node_modules/.bin/buf generate --template "$scratch/buf.gen.yaml" \
  --output "$scratch/out"
"$py" - "$scratch/out/gen" proto/baton/v1 <<'EOF'
import pathlib, re, sys
gen, protos = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
def has(path, line):
    text = (gen / path).read_text()
    assert re.search(line, text, re.M), f"{path}: no line {line!r}"
services = []
for proto in sorted(protos.glob("*.proto")):
    stem, text = proto.stem, proto.read_text()
    outer = re.search(r'java_outer_classname = "(\w+)"', text).group(1)
    has(f"go/baton/v1/{stem}.pb.go", r"^package batonv1$")
    has(f"java/baton/v1/{outer}.java", r"^package baton\.v1;$")
    has(f"csharp/{stem.capitalize()}.cs", r"^namespace Baton\.V1 \{$")
    for service in re.findall(r"^service (\w+)", text, re.M):
        services.append(service)
        has(f"go/baton/v1/{stem}_grpc.pb.go", rf"^type {service}Client interface")
        has(f"java/baton/v1/{service}Grpc.java", r"^package baton\.v1;$")
assert len(services) == 5, services
print(f"generated: Go, Java and C# messages for {len(list(protos.glob('*.proto')))} files, "
      f"Go and Java stubs for {len(services)} services")
EOF

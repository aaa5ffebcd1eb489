"""Builds baton-client: the package under src/ plus stubs generated from Baton's proto files.

The stubs (`baton.v1.*_pb2`, `*_pb2_grpc`, and `.pyi` types) are written by grpcio-tools into the
build directory, from `proto/` beside this file (an sdist) or the repository's `proto/`.
"""

import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent


def proto_root():
    for candidate in (HERE / "proto", HERE.parent.parent / "proto"):
        if (candidate / "baton" / "v1" / "lock.proto").is_file():
            return candidate
    raise SystemExit("baton-client: cannot find Baton's proto/ directory to generate the stubs")


def generate(out):
    import grpc_tools
    from grpc_tools import protoc

    root = proto_root()
    files = sorted(str(p.relative_to(root)) for p in (root / "baton" / "v1").glob("*.proto"))
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    out.mkdir(parents=True, exist_ok=True)
    args = ["grpc_tools.protoc", f"-I{root}", f"-I{well_known}", f"--python_out={out}",
            f"--pyi_out={out}", f"--grpc_python_out={out}", *files]
    if protoc.main(args) != 0:
        raise SystemExit("baton-client: protoc failed to generate the stubs")
    (out / "baton" / "v1" / "__init__.py").write_text(
        '"""Stubs generated from Baton\'s proto files by grpcio-tools (never edited by hand)."""\n')


class BuildPyWithStubs(build_py):
    """build_py, then the generated stubs next to the package."""

    def run(self):
        super().run()
        generate(pathlib.Path(self.build_lib))


setup(cmdclass={"build_py": BuildPyWithStubs})

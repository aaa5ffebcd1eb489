"""Builds baton-client: the package under src/ plus stubs generated from Baton's proto files.

The stubs (`baton.v1.*_pb2`, `*_pb2_grpc`, and `.pyi` types) are written by grpcio-tools from
`proto/` beside this file (in an sdist, which carries a copy of them) or the repository's
`proto/` (in a checkout): into the build directory for a wheel, into `src/` (not committed) for an
editable install, which imports the package from there.
"""

import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = pathlib.Path(__file__).resolve().parent
#: The proto files' package directory, below a proto root.
PACKAGE_DIR = pathlib.Path("baton", "v1")


def proto_root():
    for candidate in (HERE / "proto", HERE.parent.parent / "proto"):
        if (candidate / PACKAGE_DIR / "lock.proto").is_file():
            return candidate
    raise SystemExit("baton-client: cannot find Baton's proto/ directory to generate the stubs")


def generate(out):
    import grpc_tools
    from grpc_tools import protoc

    root = proto_root()
    files = sorted(str(p.relative_to(root)) for p in (root / PACKAGE_DIR).glob("*.proto"))
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    out.mkdir(parents=True, exist_ok=True)
    args = ["grpc_tools.protoc", f"-I{root}", f"-I{well_known}", f"--python_out={out}",
            f"--pyi_out={out}", f"--grpc_python_out={out}", *files]
    if protoc.main(args) != 0:
        raise SystemExit("baton-client: protoc failed to generate the stubs")
    (out / PACKAGE_DIR / "__init__.py").write_text(
        '"""Stubs generated from Baton\'s proto files by grpcio-tools (never edited by hand)."""\n')


class BuildPyWithStubs(build_py):
    """build_py, then the generated stubs next to the package (in src/ for an editable
    install)."""

    def run(self):
        super().run()
        generate(HERE / "src" if self.editable_mode else pathlib.Path(self.build_lib))


class SdistWithProtos(sdist):
    """sdist, with a copy of the proto files the stubs are generated from, so that a wheel can be
    built from the sdist alone."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        source = proto_root() / PACKAGE_DIR
        target = pathlib.Path(base_dir, "proto", PACKAGE_DIR)
        target.mkdir(parents=True, exist_ok=True)
        for proto in sorted(source.glob("*.proto")):
            shutil.copyfile(proto, target / proto.name)


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProtos})

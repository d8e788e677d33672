"""The self-contained wheel (scripts/wheel.sh) where Debian's gRPC is absent.

The repaired wheel is installed into a fresh virtual environment; then, in a
mount namespace where every shared library of Debian's gRPC, protobuf,
Abseil, c-ares and re2 packages (upb is part of libgrpc29) is an empty file
and LD_LIBRARY_PATH is empty, the installed psrt-run trains the PyTorch demo.

Run by ctest (tests/CMakeLists.txt) after `make wheel`, which `make test`
runs first. Needs root for the namespace.
"""

import glob
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = (os.path.dirname(os.environ["PSRT_BIN_DIR"]) if os.environ.get("PSRT_BIN_DIR")
         else os.path.join(ROOT, "build"))
DEMO = os.path.join(ROOT, "examples", "torch_digits.py")
PROGRAMS = ["psrt-run", "psrt-coordinator", "psrt-server", "psrt-worker", "psrt-ckpt"]

# Debian's library packages of gRPC (with upb), protobuf, Abseil, c-ares, re2.
HIDDEN_PACKAGES = re.compile(
    r"lib(grpc\+\+[0-9.]+|grpc[0-9]+|protobuf(-lite)?[0-9]+|protoc[0-9]+|absl[0-9]+|"
    r"c-ares[0-9]+|re2-[0-9]+|upb[0-9]*)")
# auditwheel's copies carry a hash: libgrpc.so.29 -> libgrpc-0a1b2c3d.so.29.
GRAFT_HASH = re.compile(r"-[0-9a-f]{8}(?=\.so)")

# Each training process says where psrt came from, which shared libraries it
# mapped and which program started it (the host agent), then runs the demo.
WORKER = """\
import json, os, runpy, sys
import psrt._psrt
maps = sorted({line.split()[-1] for line in open("/proc/self/maps") if ".so" in line})
with open(os.path.join(sys.argv[1], "rank%s.json" % os.environ["PSRT_RANK"]), "w") as f:
    json.dump({"psrt": psrt._psrt.__file__, "sys_path": sys.path, "maps": maps,
               "agent": os.readlink("/proc/%d/exe" % os.getppid())}, f)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def skip_reason():
    if os.geteuid() != 0:
        return "hiding the system's libraries needs a mount namespace, that is root"
    for tool in ("unshare", "dpkg-query", "ldd"):
        if shutil.which(tool) is None:
            return tool + " is missing"
    for module in ("torch", "sklearn"):
        try:
            importlib.metadata.distribution("scikit-learn" if module == "sklearn" else module)
        except importlib.metadata.PackageNotFoundError:
            return module + " is not installed (scripts/setup.sh frameworks)"
    return None


SKIP = skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=str(SKIP))


def hidden_files():
    """The real files (symlinks resolved) of every shared library that
    HIDDEN_PACKAGES install."""
    packages = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\n"], check=True, text=True,
                              stdout=subprocess.PIPE).stdout.split()
    packages = [p for p in packages if HIDDEN_PACKAGES.fullmatch(p)]
    assert any(p.startswith("libgrpc") for p in packages), packages
    listed = subprocess.run(["dpkg", "-L"] + packages, check=True, text=True, stdout=subprocess.PIPE).stdout
    return sorted({os.path.realpath(f) for f in listed.split()
                   if re.search(r"\.so(\.|$)", f) and os.path.isfile(f)})


def framework_dir(root, names=("torch", "numpy", "scikit-learn")):
    """A directory of symlinks to what `names` and their requirements install
    in this interpreter's environment, and to nothing else."""
    todo, seen = list(names), {}
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen or name in ("pip", "setuptools"):
            continue
        try:
            seen[name] = dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # a requirement for another platform
        for req in map(Requirement, dist.requires or []):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    os.makedirs(root)
    for dist in seen.values():
        for top in {f.parts[0] for f in dist.files or []}:
            target = os.path.join(str(dist.locate_file("")), top)
            link = os.path.join(root, top)
            if top in ("..", "__pycache__") or top.endswith(".pth") or os.path.lexists(link):
                continue
            os.symlink(target, link)
    return root


def run(cmd, **kw):
    # ctest's PYTHONPATH (the package built in place) stays out.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, **kw)
    assert p.returncode == 0, "%s exited %d:\n%s" % (cmd, p.returncode, p.stdout)
    return p.stdout


@pytest.fixture(scope="module")
def wheel():
    # `make test` builds it first (`make wheel`): building it here would
    # reconfigure the build tree the other tests run from.
    found = glob.glob(os.path.join(BUILD, "dist", "psrt-*.whl"))
    assert len(found) == 1, "no wheel in %s/dist: run `make wheel`" % BUILD
    server = os.path.join(BUILD, "bin", "psrt-server")
    assert os.path.getmtime(found[0]) >= os.path.getmtime(server), (
        "%s is older than %s: run `make wheel`" % (found[0], server))
    return found[0]


@pytest.fixture(scope="module")
def env(wheel):
    """A fresh virtual environment holding the wheel; yields (venv, its
    site-packages, the hidden files, hide) where hide(cmd) runs cmd with the
    libraries hidden and returns (exit code, output)."""
    with tempfile.TemporaryDirectory(prefix="psrt-wheel-") as tmp:
        venv = os.path.join(tmp, "venv")
        run([os.path.join(sys.base_prefix, "bin", "python3"), "-m", "venv", venv])
        python = os.path.join(venv, "bin", "python")
        run([python, "-m", "pip", "install", "--quiet", "--no-index", "--disable-pip-version-check", wheel])
        # torch, numpy and scikit-learn come from the project's .venv through a
        # .pth file naming a directory of links to just them and their
        # requirements: pip installing them into the fresh venv takes about 3
        # minutes here (torch and its CUDA libraries, over 4 GB unpacked),
        # linking takes milliseconds. They are not what is tested and bring
        # none of the hidden libraries (the workers' memory maps are checked
        # below); psrt can only come from the wheel: .venv has no psrt, and
        # PYTHONPATH is unset.
        site = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).strip()
        with open(os.path.join(site, "_psrt_test_frameworks.pth"), "w") as f:
            f.write(framework_dir(os.path.join(tmp, "frameworks")) + "\n")
        hidden = hidden_files()
        mounts = os.path.join(tmp, "hidden.txt")
        with open(mounts, "w") as f:
            f.write("".join(p + "\n" for p in hidden))
        environment = {"PATH": os.path.join(venv, "bin") + ":/usr/sbin:/usr/bin:/sbin:/bin",
                       "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8", "LD_LIBRARY_PATH": ""}
        script = 'while read -r f; do mount --bind /dev/null "$f"; done < "$0"; exec "$@"'

        def hide(cmd, timeout=120):
            p = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", script, mounts]
                               + cmd, env=environment, cwd=tmp, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=timeout)
            return p.returncode, p.stdout

        yield venv, site, hidden, hide


def grafted(site, path):
    """Whether `path` is one of the libraries the wheel carries."""
    return os.path.realpath(path).startswith(os.path.join(os.path.realpath(site), "psrt.libs") + "/")


def test_wheel_is_manylinux_and_installs_the_programs(wheel, env):
    venv, site, _, _ = env
    assert re.search(r"-manylinux_\d+_\d+_x86_64\.whl$", wheel), wheel
    for name in PROGRAMS:
        # auditwheel moves each program beside the libraries it needs and
        # installs a launcher in its place.
        assert os.access(os.path.join(venv, "bin", name), os.X_OK), name
        with open(os.path.join(site, "psrt.scripts", name), "rb") as f:
            assert f.read(4) == b"\x7fELF", name


def test_wheel_hidden_libraries_are_really_hidden(env):
    _, _, hidden, hide = env
    # Debian 12: 64 of Abseil, 13 of gRPC (upb included), 3 of protobuf, c-ares, re2.
    assert len(hidden) > 50, hidden
    code, out = hide(["python", "-c", "import ctypes; ctypes.CDLL('libgrpc++.so.1.51')"])
    assert code != 0 and "libgrpc++.so.1.51" in out, out


def test_wheel_libraries_resolve_inside_the_wheel(env):
    venv, site, hidden, hide = env
    hidden_names = {os.path.basename(p).split(".so")[0] for p in hidden}
    for elf in (glob.glob(os.path.join(site, "psrt", "_psrt*.so"))
                + [os.path.join(site, "psrt.scripts", "psrt-server")]):
        code, out = hide(["ldd", elf])
        assert code == 0 and "not found" not in out, out
        resolved = dict(re.findall(r"^\s*(\S+) => (/\S+)", out, re.M))
        assert any(n.startswith("libgrpc-") for n in resolved), out
        for name, path in resolved.items():
            assert os.path.realpath(path) not in hidden, out
            if GRAFT_HASH.sub("", name).split(".so")[0] in hidden_names:
                assert grafted(site, path), "%s: %s resolved from %s" % (elf, name, path)


def test_wheel_installed_psrt_run_trains_the_demo(env):
    venv, site, hidden, hide = env
    tmp = os.path.dirname(venv)
    with open(os.path.join(tmp, "worker.py"), "w") as f:
        f.write(WORKER)
    reports = os.path.join(tmp, "reports")
    os.makedirs(reports)
    dist = {"parameter_server": {"enabled": True, "mode": "sync", "compression": "fp16",
                                 "checkpoint": {"uri": "file://" + os.path.join(tmp, "ckpt"), "keep": 2}}}
    code, out = hide([os.path.join(venv, "bin", "psrt-run"), "--local=2", "--distribution=" + json.dumps(dist),
                      "--", "python", os.path.join(tmp, "worker.py"), reports, DEMO], timeout=240)
    assert code == 0, out
    accuracy = re.search(r"demo: test accuracy ([0-9.]+)", out)
    assert accuracy and float(accuracy.group(1)) >= 0.93, out
    hidden_names = {os.path.basename(p).split(".so")[0] for p in hidden}
    ranks = sorted(os.listdir(reports))
    assert ranks == ["rank0.json", "rank1.json"], ranks
    for rank in ranks:
        with open(os.path.join(reports, rank)) as f:
            report = json.load(f)
        assert report["psrt"].startswith(site + "/psrt/"), report["psrt"]
        assert report["agent"] == os.path.join(site, "psrt.scripts", "psrt-worker"), report["agent"]
        assert not any(p.startswith(BUILD) for p in report["sys_path"]), report["sys_path"]
        libs = [p for p in report["maps"] if GRAFT_HASH.sub("", os.path.basename(p)).split(".so")[0] in hidden_names]
        assert any("libgrpc" in p for p in libs), report["maps"]
        for path in libs:
            assert grafted(site, path), "%s mapped %s" % (rank, path)

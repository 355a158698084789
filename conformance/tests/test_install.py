"""The conformance suite as another team installs it: a wheel from ``./conformance`` and from a
git URL with ``#subdirectory=conformance``, into a fresh virtualenv, run outside the repository.

Offline: the wheels are built with the dev environment's hatchling (``--no-build-isolation``)
and installed ``--no-deps``; the fresh environment sees the dev environment's third-party
packages through a ``.pth`` file (not its ``portable_ckpt`` or the checkout), and ``pip check``
proves the declared dependencies are what it needs.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import site
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from conformance.vectors import load_cases

from .conftest import REPO, TRACING

CONF = REPO / "conformance"


def _pip(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                       capture_output=True, text=True, cwd=cwd, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def _wheel(source: str, out: Path) -> Path:
    _pip("wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w", str(out), source)
    (whl,) = out.glob("portable_ckpt_conformance-*.whl")
    return whl


def _git_repo(dest: Path) -> Path:
    """A git repository holding this checkout's spec/ and conformance/ (working tree)."""
    dest.mkdir()
    shutil.copytree(REPO / "spec", dest / "spec")
    shutil.copytree(CONF, dest / "conformance", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "tests"))
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "snapshot"]):
        subprocess.run(["git", *cmd], cwd=dest, env=env, check=True, capture_output=True)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(fresh venv, a directory outside the repository) with the wheel installed."""
    if shutil.which("git") is None:
        pytest.skip("git is needed for the git-URL install")
    tmp = tmp_path_factory.mktemp("install")
    whl = _wheel(str(CONF), tmp / "dist")
    repo = _git_repo(tmp / "repo")
    from_git = _wheel(f"portable-ckpt-conformance @ git+file://{repo}#subdirectory=conformance",
                      tmp / "dist-git")
    assert sorted(_names(whl)) == sorted(_names(from_git))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path("
                              "'purelib'))"], capture_output=True, text=True, check=True)
    Path(purelib.stdout.strip(), "dev-deps.pth").write_text("\n".join(site.getsitepackages()))
    _pip("--python", str(py), "install", "--no-deps", "--no-index", str(whl))
    _pip("--python", str(py), "check")  # the declared dependencies are all there
    outside = tmp / "outside"
    outside.mkdir()
    return venv, outside


def _names(whl: Path) -> list[str]:
    import zipfile

    with zipfile.ZipFile(whl) as z:
        return [n for n in z.namelist() if ".dist-info/" not in n]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PCK_SPEC_SCHEMAS", "PCK_BAD_MODE"):
        env.pop(k, None)
    return env


def _tool(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "portable-ckpt-conformance"), *args], cwd=cwd,
                          env=_env(), capture_output=True, text=True, timeout=600)


def _package(venv: Path, outside: Path) -> Path:
    r = subprocess.run([str(venv / "bin" / "python"), "-c",
                        "import conformance; print(conformance.__file__)"],
                       cwd=outside, env=_env(), capture_output=True, text=True, check=True)
    return Path(r.stdout.strip()).parent


def test_installed_package_is_self_contained(installed: tuple[Path, Path]) -> None:
    venv, outside = installed
    pkg = _package(venv, outside)
    assert venv in pkg.parents  # not the checkout
    schemas = pkg / "_schemas"
    assert not schemas.is_symlink()
    spec = REPO / "spec" / "schemas"
    files = sorted(p.relative_to(spec).as_posix() for p in spec.rglob("*.json"))
    assert files == sorted(p.relative_to(schemas).as_posix() for p in schemas.rglob("*.json"))
    differ = [f for f in files if (schemas / f).read_bytes() != (spec / f).read_bytes()]
    assert not differ, differ
    assert not (pkg / "tests").exists()
    assert (pkg / "examples" / "minimal_writer.py").is_file()
    assert (pkg / "examples" / "minimal_gc.py").is_file()
    assert _tool(venv, "--help", cwd=outside).returncode == 0
    # the vector set's fingerprint is the checkout's (outside CI review, finding 9)
    from conformance.report import vectors_sha256

    shown = _tool(venv, "--version", cwd=outside).stdout.splitlines()
    assert shown[1] == f"vectors sha256 {vectors_sha256()}", shown
    m = subprocess.run([str(venv / "bin" / "python"), "-m", "conformance", "--help"], cwd=outside,
                       env=_env(), capture_output=True, text=True)
    assert m.returncode == 0 and "writer" in m.stdout


def test_installed_check_and_writer_outside_the_repository(installed: tuple[Path, Path]) -> None:
    venv, outside = installed
    pkg = _package(venv, outside)
    vectors = pkg / "vectors" / "1.0"
    valid = next(c for c in load_cases(vectors) if c["valid"])
    invalid = next(c for c in load_cases(vectors) if not c["valid"] and not c.get("setup"))
    for case in (valid, invalid):
        shutil.copytree(vectors / case["name"], outside / case["name"], symlinks=True)
    ok = _tool(venv, "check", str(outside / valid["name"] / valid["target"]), cwd=outside)
    assert ok.returncode == 0 and "conformant" in ok.stdout, ok.stdout + ok.stderr
    bad = _tool(venv, "check", "--deep", str(outside / invalid["name"] / invalid["target"]),
                cwd=outside)
    assert bad.returncode == 1 and invalid["code"] in bad.stdout
    # the installed suite proves itself on every golden vector it ships (adopter review F13)
    vec = _tool(venv, "vectors", cwd=outside)
    assert vec.returncode == 0 and "the checker agrees with" in vec.stdout, vec.stdout + vec.stderr
    assert int(vec.stdout.split("agrees with ")[1].split()[0]) >= 198
    before = sorted(p.name for p in outside.iterdir())
    w = _tool(venv, "writer", "--examples", "1", "--codec", "zstd", "--crash-examples", "0",
              "--no-committer", "--tracing", "auto", "--", str(venv / "bin" / "python"),
              str(pkg / "examples" / "minimal_writer.py"), cwd=outside)
    # --tracing auto: exit 6 where no strace runs (a pass without the system-call checks)
    assert w.returncode == (0 if TRACING else 6) and "writer passed" in w.stdout, \
        w.stdout + w.stderr
    assert sorted(p.name for p in outside.iterdir()) == before  # nothing in the working dir


def _requirement_names(pyproject: Path) -> set[str]:
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}


def test_every_third_party_import_is_declared() -> None:
    """Scan the shipped modules: each non-stdlib import belongs to a declared distribution."""
    declared = _requirement_names(CONF / "pyproject.toml")
    owners = metadata.packages_distributions()
    shipped = [p for p in CONF.rglob("*.py") if "tests" not in p.relative_to(CONF).parts]
    missing: dict[str, str] = {}
    for path in shipped:
        if path.name in ("reference_writer.py", "reference_gc.py",  # adapters *of* portable_ckpt
                         "reference_reader.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and \
                not node.level else []
            for mod in mods:
                top = mod.split(".")[0]
                if top in sys.stdlib_module_names or top in ("conformance", "__future__"):
                    continue
                dists = {d.lower().replace("_", "-") for d in owners.get(top, [top])}
                if not dists & declared:
                    missing[top] = str(path.relative_to(REPO))
    assert not missing, f"imports without a declared dependency: {missing}"


def test_the_build_backend_is_pinned() -> None:
    """Outside CI review, finding 9: a wheel built again from the same tree is the same wheel
    only with the same build backend; ``hatchling>=1.25`` took whatever was newest."""
    build = tomllib.loads((CONF / "pyproject.toml").read_text())["build-system"]
    (req,) = build["requires"]
    name, _, version = req.partition("==")
    assert name == "hatchling" and version.count(".") == 2, req
    text = (CONF / "README.md").read_text()
    assert f"`{req}`" in text and "vectors sha256" in text


def test_the_readme_names_every_dependency() -> None:
    """DOC-2: the README's list of dependencies is the pyproject's (licences, platforms)."""
    text = (CONF / "README.md").read_text()
    m = re.search(r"Its dependencies are ([^;(]+?)(?: \(|;)", text.replace("\n", " "))
    assert m, "the README no longer lists the dependencies"
    named = {n.strip().lower() for n in re.split(r",| and ", m.group(1)) if n.strip()}
    assert named == _requirement_names(CONF / "pyproject.toml")


def test_the_ci_snippet_uploads_the_failed_cases() -> None:
    """DOC-3: the GitHub Actions job keeps failed case directories in a --workdir that its
    upload step takes along (a default work directory is a random temporary one)."""
    text = (CONF / "README.md").read_text()
    snippet = text.split("```yaml", 1)[1].split("```", 1)[0]
    m = re.search(r"portable-ckpt-conformance writer .*?--workdir (\S+)", snippet, re.DOTALL)
    assert m, "the writer step passes no --workdir"
    path = snippet.split("path: |", 1)[1]
    assert any(line.strip().rstrip("/") == m.group(1).rstrip("/")
               for line in path.splitlines()), path

"""``llamapy/engine`` stays backend-agnostic: it never imports cffi or ``llamapy._native``."""

from __future__ import annotations

import ast
from pathlib import Path

import llamapy.engine

ENGINE = Path(llamapy.engine.__file__).parent
FORBIDDEN = ("cffi", "_cffi_backend", "llamapy._native", "llamapy.llama_backend")


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against llamapy.engine
                base = ["llamapy", "engine"][: max(0, 2 - (node.level - 1))]
                found.append(".".join([*base, *filter(None, [node.module])]))
            else:
                found.append(node.module or "")
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            found += [a.value for a in node.args if isinstance(a, ast.Constant)]
    return found


def test_engine_never_imports_cffi_or_native():
    files = sorted(ENGINE.rglob("*.py"))
    assert len(files) > 5
    bad = [(f.name, m) for f in files for m in imported_modules(f)
           if any(m == x or m.startswith(x + ".") for x in FORBIDDEN)]
    assert bad == []


def test_the_scan_catches_forbidden_imports(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("import cffi\nfrom .._native import lib\nfrom llamapy._native.x import y\n")
    mods = imported_modules(sample)
    assert "cffi" in mods and "llamapy._native" in mods and "llamapy._native.x" in mods


PACKAGE = ENGINE.parent


def _module_imports(package: str) -> set[str]:
    """Every llamapy module imported (at any level, TYPE_CHECKING included) by ``package``."""
    found: set[str] = set()
    for path in sorted((PACKAGE / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = ["llamapy", package][: max(0, 2 - (node.level - 1))]
                found.add(".".join([*base, *filter(None, [node.module])]))
            elif isinstance(node, ast.ImportFrom):
                found.add(node.module or "")
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return {m for m in found if m.startswith("llamapy")}


def test_session_never_touches_the_engines_backend():
    """The engine owns every KV mutation: a session asks ``engine.leases``, never the backend."""
    offenders = []
    for path in sorted((PACKAGE / "session").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "backend":
                inner = node.value
                name = getattr(inner, "id", getattr(inner, "attr", ""))
                if name == "engine":
                    offenders.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "getattr" and \
                    any(isinstance(a, ast.Constant) and a.value in ("backend", "ctx")
                        for a in node.args):
                offenders.append(f"{path.name}:{node.lineno} getattr")
    assert offenders == []


def test_no_import_cycle_between_server_and_session():
    assert not any(m.startswith("llamapy.server") for m in _module_imports("session"))
    assert not any(m.startswith("llamapy.session") for m in _module_imports("runtime"))
    assert not any(m.startswith("llamapy.server") for m in _module_imports("runtime"))


def test_runtime_core_never_imports_native():
    """Only ``runtime/native.py`` (hosting an engine on libllama) touches the binding."""
    for path in sorted((PACKAGE / "runtime").glob("*.py")):
        if path.name == "native.py":
            continue
        mods = imported_modules(path)
        assert not [m for m in mods if any(m == x or m.startswith(x + ".") for x in FORBIDDEN)], \
            path.name


#: The packages above the server: they reach the model through ``llamapy.server`` only.
API_PACKAGES = ("openai_api", "anthropic_api", "ollama_api", "serve", "ray", "chat", "grammar")
#: Files allowed past that rule, and why.
API_EXCEPTIONS = {
    # the entry point maps the weights in before it imports any layer (startup time)
    "serve/__main__.py": ("llamapy._native.prefetch",),
}


def api_binding_imports(package_dir: Path, root: Path = PACKAGE) -> list[tuple[str, str]]:
    """(file, module) for each import of the binding (or the backend on it) under
    ``package_dir`` (in the ``llamapy`` folder ``root``), but the allowed ones of
    :data:`API_EXCEPTIONS`."""
    bad = []
    for path in sorted(package_dir.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        base = ["llamapy", *path.relative_to(root).parent.parts]
        for module in _imports_of(path, base):
            if any(module == x or module.startswith(x + ".") for x in FORBIDDEN[2:]) and \
                    module not in API_EXCEPTIONS.get(name, ()):
                bad.append((name, module))
    return bad


def _imports_of(path: Path, base: list[str]) -> list[str]:
    """Every module ``path`` imports, relative imports resolved against its package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            prefix = base[: len(base) - (node.level - 1)] if node.level else []
            found.append(".".join([*prefix, *filter(None, [node.module])]))
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


def test_api_packages_reach_the_model_through_the_server_only():
    """The API adapters, the HTTP server and the chat layer never import the binding: the
    server layer hands out what they need (``llamapy.server.Model``)."""
    assert {p: api_binding_imports(PACKAGE / p) for p in API_PACKAGES} == {
        p: [] for p in API_PACKAGES}


def test_the_api_scan_catches_a_binding_import(tmp_path):
    package = tmp_path / "llamapy" / "openai_api" / "deep"
    package.mkdir(parents=True)
    (package / "x.py").write_text("from ..._native import Model\n")
    (package / "y.py").write_text("from llamapy.llama_backend import LlamaBackend\n")
    found = api_binding_imports(package.parent, root=tmp_path / "llamapy")
    assert found == [("openai_api/deep/x.py", "llamapy._native"),
                     ("openai_api/deep/y.py", "llamapy.llama_backend")]


#: What only the server's resolver (``llamapy.server.intent.resolve_intent``) may build: the
#: typed request options. The API packages hand it their fields (``ServedModel.intent``) and
#: get back a ``GenerationIntent``.
RESOLVER_ONLY = ("RequestOptions", "SamplingParams", "resolve_request_options")


def options_built_outside_the_resolver(package_dir: Path, root: Path = PACKAGE
                                       ) -> list[tuple[str, str]]:
    """(file, name) for each use of :data:`RESOLVER_ONLY` under ``package_dir``."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            name = node.id if isinstance(node, ast.Name) else (
                node.attr if isinstance(node, ast.Attribute) else None)
            if name in RESOLVER_ONLY:
                found.append((path.relative_to(root).as_posix(), name))
    return sorted(set(found))


def test_api_packages_build_no_request_options_of_their_own():
    packages = ("openai_api", "anthropic_api", "ollama_api", "serve", "ray")
    assert {p: options_built_outside_the_resolver(PACKAGE / p) for p in packages} == {
        p: [] for p in packages}


def test_the_resolver_scan_catches_a_direct_build(tmp_path):
    package = tmp_path / "llamapy" / "ollama_api"
    package.mkdir(parents=True)
    (package / "x.py").write_text("from llamapy.options import SamplingParams\n"
                                  "params = SamplingParams(temp=0.0)\n")
    (package / "y.py").write_text("import llamapy.options as o\n"
                                  "o.resolve_request_options({})\n")
    found = options_built_outside_the_resolver(package, root=tmp_path / "llamapy")
    assert found == [("ollama_api/x.py", "SamplingParams"),
                     ("ollama_api/y.py", "resolve_request_options")]


#: What only OpenAI's own chat route may use: its body and the parser taking it. Every other
#: chat API translates its own body into a ``ChatRequest`` (no API's shape) and hands it to
#: ``prepare_request``; none is rebuilt as an OpenAI body and parsed again.
OPENAI_CHAT_ONLY = frozenset({"ChatBody", "prepare_chat"})


def openai_chat_uses(files: list[Path], root: Path = PACKAGE) -> list[tuple[str, str]]:
    """(file, name) for each import of :data:`OPENAI_CHAT_ONLY` from ``openai_api``."""
    found = []
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = node.module or ""
            openai = "openai_api" in module or (
                node.level == 1 and path.parent.name == "openai_api")
            found += [(path.relative_to(root).as_posix(), alias.name) for alias in node.names
                      if openai and alias.name in OPENAI_CHAT_ONLY]
    return sorted(found)


def test_other_chat_apis_never_rebuild_an_openai_body():
    files = [*sorted((PACKAGE / "anthropic_api").rglob("*.py")),
             *sorted((PACKAGE / "ollama_api").rglob("*.py")),
             PACKAGE / "openai_api" / "responses_input.py"]
    assert openai_chat_uses(files) == []


def test_the_rebuild_scan_catches_an_openai_body(tmp_path):
    package = tmp_path / "llamapy" / "anthropic_api"
    package.mkdir(parents=True)
    (package / "x.py").write_text("from ..openai_api.params import ChatBody, parse_body\n")
    (package / "y.py").write_text("from llamapy.openai_api.prompt import prepare_chat\n")
    found = openai_chat_uses(sorted(package.glob("*.py")), root=tmp_path / "llamapy")
    assert found == [("anthropic_api/x.py", "ChatBody"), ("anthropic_api/y.py", "prepare_chat")]


def test_media_touches_the_binding_in_its_encoder_only():
    """``llamapy.media`` is read by the API layers (probing, sources, checks): only its encoder,
    which the server hosts, imports the binding."""
    files = sorted((PACKAGE / "media").glob("*.py"))
    assert any(f.name == "encoder.py" for f in files)
    bad = [(f.name, m) for f in files if f.name != "encoder.py" for m in imported_modules(f)
           if any(m == x or m.startswith(x + ".") for x in FORBIDDEN)]
    assert bad == []

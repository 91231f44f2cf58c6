"""The committed betterproto code under src/danube/proto must be exactly what `nox -s protos`
produces from proto/; otherwise an edited .proto ships with stale Python types."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

ROOT = pathlib.Path(__file__).parent.parent.parent


def _load_noxfile() -> ModuleType:
    """Regenerates with noxfile.generate_protos itself, so this test cannot drift from the
    session it polices."""
    spec = importlib.util.spec_from_file_location("noxfile", ROOT / "noxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(root: pathlib.Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_generated_code_matches_protos(tmp_path: pathlib.Path) -> None:
    noxfile = _load_noxfile()
    noxfile.generate_protos(tmp_path)
    fresh = _tree(tmp_path)
    committed = _tree(noxfile.GENERATED_DIR)

    assert fresh, "protoc generated nothing"
    missing = sorted(fresh.keys() - committed.keys())
    extra = sorted(committed.keys() - fresh.keys())
    assert not missing and not extra, (
        f"generated files not committed: {missing}; committed files protoc no longer generates: "
        f"{extra}; run `nox -s protos`"
    )
    stale = [name for name in sorted(fresh) if fresh[name] != committed[name]]
    assert not stale, f"committed generated code is stale: {stale}; run `nox -s protos`"

"""`danube-local-cluster --auth-config FILE` (spec/security.md, "A secured local cluster"):
the file's `auth` section (or the whole file) goes to every broker, its relative certificate
and key paths made absolute (each broker runs in its own directory); a file that is no
mapping is refused with a one-line reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube.cli.local_cluster import _auth_section, main
from danube.localcluster.cluster import ClusterSettings, LocalCluster


def test_relative_paths_become_absolute(tmp_path: Path) -> None:
    path = tmp_path / "auth.yaml"
    path.write_text(
        "auth:\n  mode: tls\n  tls: {cert_file: b.pem, key_file: b.key, ca_file: ca.pem}\n"
        "  super_admins: [root]\n"
    )
    auth = _auth_section(path)
    assert auth is not None
    assert auth["tls"] == {  # type: ignore[comparison-overlap]
        "cert_file": str(tmp_path / "b.pem"),
        "key_file": str(tmp_path / "b.key"),
        "ca_file": str(tmp_path / "ca.pem"),
    }
    path.write_text("mode: tls\njwt: {algorithm: RS256, public_key_file: keys/t.pub}\n")
    bare = _auth_section(path)
    assert bare is not None and bare["jwt"] == {  # type: ignore[comparison-overlap]
        "algorithm": "RS256",
        "public_key_file": str(tmp_path / "keys" / "t.pub"),
    }
    cluster = LocalCluster(tmp_path, ClusterSettings(auth=bare))
    assert cluster.broker_config()["auth"] == bare


@pytest.mark.parametrize("text", ["- a list", "auth: 3", "{unclosed"])
def test_a_file_that_is_no_auth_mapping_is_refused(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "auth.yaml"
    path.write_text(text)
    assert main(["--auth-config", str(path), "--dir", str(tmp_path / "c")]) == 2
    assert "--auth-config" in capsys.readouterr().err

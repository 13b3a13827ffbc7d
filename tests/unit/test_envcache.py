"""The environment kept in the bucket (bootstrap/remote/envcache.py) against the real Cloud Storage emulator.

A fake venv on a fake uv-managed Python (its minor-version link too, as uv names it) stands for the real
one: what matters here is that a restore gives back the same tree byte for byte, or nothing at all.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from bootstrap.jobs import load, show
from bootstrap.jobs.plan import build
from bootstrap.paths import REPO
from bootstrap.remote import envcache, faults, gcs
from tests import gcsemulator


@pytest.fixture
def machine(tmp_path, monkeypatch, gcs_emulator) -> dict:
    """A built environment on this "VM": the venv, uv's Python and the bucket folder they are kept in."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("UV_PYTHON_INSTALL_DIR", str(tmp_path / "uv-python"))
    monkeypatch.setattr(envcache, "PART_BYTES", 4096)  # several parts from a small tree
    installation = tmp_path / "uv-python" / "cpython-3.12.8-linux-x86_64-gnu"
    (installation / "bin").mkdir(parents=True)
    (installation / "bin" / "python3.12").write_bytes(b"#!/bin/sh\n" + os.urandom(9000))
    (installation / "bin" / "python3.12").chmod(0o755)
    (installation / "lib").mkdir()
    (installation / "lib" / "os.py").write_text("# the standard library\n")
    link = tmp_path / "uv-python" / "cpython-3.12-linux-x86_64-gnu"
    link.symlink_to(installation.name)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {link}/bin\nversion_info = 3.12.8\n")
    (venv / "bin" / "python").symlink_to(f"{link}/bin/python3.12")
    site = venv / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    for n in range(5):
        (site / f"module{n}.py").write_bytes(os.urandom(3000))
    (site / "mode.so").write_bytes(os.urandom(100))
    (site / "mode.so").chmod(0o700)
    os.link(site / "module0.py", site / "hardlinked.py")
    (venv / ".tpu-rl-spec").write_text("abc123\n")
    cache = f"gs://{gcsemulator.BUCKET}/{uuid.uuid4().hex[:8]}/tpu-rl/environments"
    return {"venv": venv, "installation": installation, "link": link, "cache": cache}


def tree(*roots: Path) -> dict[str, tuple]:
    """Every entry below `roots`: its type, mode, and bytes (a file's SHA-256) or link target."""
    found = {}
    for root in roots:
        found[str(root)] = ("link", os.readlink(root)) if root.is_symlink() else ("dir", root.stat().st_mode)
        for folder, dirs, files in os.walk(root):
            for name in dirs + files:
                path = Path(folder) / name
                if path.is_symlink():
                    found[str(path)] = ("link", os.readlink(path))
                elif path.is_dir():
                    found[str(path)] = ("dir", path.stat().st_mode)
                else:
                    found[str(path)] = ("file", path.stat().st_mode, hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def wipe(machine: dict) -> None:
    """A new VM: neither the venv nor uv's Python."""
    shutil.rmtree(machine["venv"])
    shutil.rmtree(machine["installation"])
    machine["link"].unlink()


def objects(machine: dict) -> dict[str, int]:
    return gcs.sizes(machine["cache"])


def delete(url: str) -> None:
    bucket, name = gcs.split(url)
    quoted = urllib.parse.quote(name, safe="")
    request = urllib.request.Request(f"{gcs._base()}/storage/v1/b/{bucket}/o/{quoted}", method="DELETE")
    urllib.request.urlopen(request).close()


def test_a_kept_environment_comes_back_byte_for_byte_on_a_new_vm(machine):
    venv, installation, link = machine["venv"], machine["installation"], machine["link"]
    built = tree(venv, installation, link)
    said = envcache.store("abc123", str(venv), machine["cache"])
    assert said.startswith("environment kept in gs://") and "parts" in said
    assert len([n for n in objects(machine) if "/parts/" in n]) > 3
    wipe(machine)
    said = envcache.restore("abc123", str(venv), machine["cache"])
    assert said.startswith("environment restored from gs://") and said.endswith("not built")
    assert tree(venv, installation, link) == built
    assert not Path(f"{venv}.restoring").exists()


def test_the_same_key_is_kept_once(machine):
    envcache.store("abc123", str(machine["venv"]), machine["cache"])
    before = objects(machine)
    assert envcache.store("abc123", str(machine["venv"]), machine["cache"]).startswith("environment already kept")
    assert objects(machine) == before


def test_two_specs_never_share_an_environment(machine):
    venv = str(machine["venv"])
    envcache.store("abc123", venv, machine["cache"])
    assert envcache.entry_url(machine["cache"], envcache.key_fields("abc123", venv)) != envcache.entry_url(
        machine["cache"], envcache.key_fields("def456", venv)
    )
    with pytest.raises(envcache.Refused, match=r"^none kept for this spec and machine"):
        envcache.restore("def456", venv, machine["cache"])


@pytest.mark.parametrize("damage", ["corrupt", "missing", "no manifest", "another key", "not a manifest"])
def test_a_damaged_entry_restores_nothing_and_leaves_a_half_built_venv_alone(machine, damage):
    venv = str(machine["venv"])
    envcache.store("abc123", venv, machine["cache"])
    url = envcache.entry_url(machine["cache"], envcache.key_fields("abc123", venv))
    last_part = sorted(n for n in objects(machine) if "/parts/" in n)[-1]
    if damage == "corrupt":
        gcs.write(last_part, b"other bytes")
    elif damage == "missing":
        delete(last_part)
    elif damage == "no manifest":  # a store that was cut off before its end
        delete(f"{url}/{envcache.MANIFEST}")
    elif damage == "another key":
        other = envcache.entry_url(machine["cache"], envcache.key_fields("def456", venv))
        gcs.write(f"{other}/{envcache.MANIFEST}", gcs.read(f"{url}/{envcache.MANIFEST}"))
    else:
        gcs.write(f"{url}/{envcache.MANIFEST}", b"{half a")
    wipe(machine)
    machine["venv"].mkdir()
    (machine["venv"] / "half-built").write_text("a build that was cut off")
    spec = "def456" if damage == "another key" else "abc123"
    why = {
        "corrupt": "is corrupt",
        "missing": "is missing",
        "no manifest": "none kept",
        "another key": "holds another key's environment",
        "not a manifest": "is not a manifest",
    }[damage]
    with pytest.raises(envcache.Refused, match=why):
        envcache.restore(spec, venv, machine["cache"])
    assert [p.name for p in machine["venv"].iterdir()] == ["half-built"]  # nothing mixed in, nothing removed
    assert not machine["installation"].exists() and not machine["link"].is_symlink()
    assert not Path(f"{venv}.restoring").exists()


def test_the_setup_job_is_told_in_one_line_to_build(machine, capsys):
    code = envcache.main(["restore", "abc123", str(machine["venv"]), machine["cache"]])
    lines = capsys.readouterr().out.splitlines()
    assert code == envcache.BUILD and len(lines) == 1
    assert lines[0].startswith("environment: building it (none kept for this spec and machine")


def test_fab_plan_says_whether_a_new_vm_restores_or_builds_and_the_setup_job_restores_first():
    files = load.read(REPO / "jobs")
    without = build(files, [])
    assert show.environment_source(without).startswith("builds it (no bucket")
    kept = build(files, ["vars.durable_dir=gs://my-bucket/llama3.1-8b-Instruct"])
    assert show.environment_source(kept).startswith("restores it from gs://my-bucket/tpu-rl/environments when")
    assert show.plan_dict(kept, None)["environment"]["new_vm"] == show.environment_source(kept)
    script = kept.job("setup").runner_spec["argv"][2]
    restore = script.index("envcache.py restore ")
    assert restore < script.index("uv venv --clear") < script.index("envcache.py store ")
    assert "envcache.py" not in without.job("setup").runner_spec["argv"][2]


def plant(machine: dict, members: list[tuple[tarfile.TarInfo, bytes | None]], python: dict | None = None) -> None:
    """An entry for this key written by someone else who may write the bucket: a crafted tar and manifest."""
    venv = str(machine["venv"])
    fields = envcache.key_fields("abc123", venv)
    url = envcache.entry_url(machine["cache"], fields)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    data = buffer.getvalue()
    gcs.write(f"{url}/parts/00000-x", data)
    part = {"name": "parts/00000-x", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    python = python or {"home": "/usr/bin", "installation": None, "link": None}
    manifest = {"key": fields, "python": python, "parts": [part], "bytes": len(data)}
    gcs.write(f"{url}/{envcache.MANIFEST}", json.dumps(manifest).encode())


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", data: bytes = b"") -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info, data if kind == tarfile.REGTYPE else None


@pytest.mark.parametrize(
    "attack",
    [
        "hard link out",
        "file through a symlink",
        "file over a symlink",
        "file through a hard link to a symlink",
        "file through a dotted name",
        "modes through a hard link to a symlink",
        "symlink over a folder tarfile made",
        "the venv itself a symlink",
        "a NUL byte in a name",
        "python folder",
    ],
)
def test_a_crafted_entry_writes_nothing_outside_the_venv_and_uvs_python(machine, tmp_path, monkeypatch, attack):
    """Review: the bucket is not trusted to choose paths, whether or not this Python's tarfile has filters."""
    victim, outside = tmp_path / "victim", tmp_path / "outside"
    victim.write_text("the user's own file\n")
    victim.chmod(0o600)
    outside.mkdir()
    top = member("venv", tarfile.DIRTYPE)
    if attack == "hard link out":
        plant(machine, [top, member("venv/x", tarfile.LNKTYPE, str(victim)), member("venv/x", data=b"PWNED\n")])
    elif attack == "file through a symlink":
        monkeypatch.delattr(tarfile, "tar_filter")  # the VM's Python 3.10 before 3.10.12 has no filters
        plant(machine, [top, member("venv/d", tarfile.SYMTYPE, str(outside)), member("venv/d/evil", data=b"PWNED\n")])
    elif attack == "file over a symlink":
        monkeypatch.delattr(tarfile, "tar_filter")
        plant(machine, [top, member("venv/x", tarfile.SYMTYPE, str(victim)), member("venv/x", data=b"PWNED\n")])
    elif attack == "file through a hard link to a symlink":  # link() on a symlink makes another symlink
        symlink, hard = member("venv/a", tarfile.SYMTYPE, str(outside)), member("venv/b", tarfile.LNKTYPE, "venv/a")
        plant(machine, [top, symlink, hard, member("venv/b/evil", data=b"PWNED\n")])
    elif attack == "file through a dotted name":
        symlink = member("venv/d", tarfile.SYMTYPE, str(outside))
        plant(machine, [top, symlink, member("venv/./d/evil", data=b"PWNED\n")])
    elif attack == "modes through a hard link to a symlink":  # tarfile's chmod and utime follow the copied link
        symlink, hard = member("venv/a", tarfile.SYMTYPE, str(victim)), member("venv/b", tarfile.LNKTYPE, "venv/a")
        hard[0].mode, hard[0].mtime = 0o777, 0
        plant(machine, [top, symlink, hard])
    elif attack == "symlink over a folder tarfile made":  # then the link's target extracted unchecked, mode 7777
        folder = member("venv/t", tarfile.DIRTYPE)
        folder[0].mode = 0o7777
        plant(machine, [top, member("venv/lib/site.py", data=b"x\n"), member("venv/lib", tarfile.SYMTYPE, "t"), folder])
    elif attack == "the venv itself a symlink":
        plant(machine, [member("venv", tarfile.SYMTYPE, str(outside))])
    elif attack == "a NUL byte in a name":
        named = member("venv/x", data=b"x\n")
        named[0].pax_headers = {"path": "venv/a\x00b"}
        plant(machine, [top, named])
    else:
        python = {"home": "/nowhere", "installation": str(tmp_path / ".ssh"), "link": [str(tmp_path / ".profile"), "/"]}
        plant(machine, [top, member("python", tarfile.DIRTYPE), member("python/authorized_keys", data=b"x\n")], python)
    wipe(machine)
    with pytest.raises(envcache.Refused):
        envcache.restore("abc123", str(machine["venv"]), machine["cache"])
    assert victim.read_text() == "the user's own file\n" and list(outside.iterdir()) == []
    assert victim.stat().st_mode & 0o7777 == 0o600 and victim.stat().st_mtime > 0
    assert not (tmp_path / ".ssh").exists() and not (tmp_path / ".profile").is_symlink()
    assert not machine["venv"].is_symlink() and not machine["venv"].exists()
    assert not Path(f"{machine['venv']}.restoring").exists()


def test_a_half_restore_that_cannot_be_removed_is_never_unpacked_into(machine, tmp_path, monkeypatch):
    """Review: a folder left by an earlier restore (one its owner cannot remove) may hold a symlink out."""
    outside = tmp_path / "outside"
    outside.mkdir()
    left = Path(f"{machine['venv']}.restoring") / "venv" / "d"
    left.mkdir(parents=True)
    (left / "s").symlink_to(outside)
    plant(machine, [member("venv", tarfile.DIRTYPE), member("venv/d/s/authorized_keys", data=b"ATTACKER\n")])
    wipe(machine)
    monkeypatch.setattr(envcache.shutil, "rmtree", lambda path, ignore_errors=False: None)  # as if it failed
    with pytest.raises(envcache.Refused, match="is left from an earlier restore and cannot be removed"):
        envcache.restore("abc123", str(machine["venv"]), machine["cache"])
    assert list(outside.iterdir()) == []


def test_a_read_only_folder_is_restored_read_only_once_everything_below_it_is_written(machine, monkeypatch):
    folder = member("venv/d", tarfile.DIRTYPE)
    folder[0].mode = 0o555
    plant(machine, [member("venv", tarfile.DIRTYPE), folder, member("venv/d/f", data=b"x\n")])
    wipe(machine)
    modes, extract = {}, tarfile.TarFile.extract

    def noting(tar, info, path, **kwargs):  # the folder's mode when its file is written (root writes anyway)
        if info.name == "venv/d/f":
            modes["while writing"] = os.stat(os.path.join(path, "venv", "d")).st_mode & 0o777
        return extract(tar, info, path, **kwargs)

    monkeypatch.setattr(tarfile.TarFile, "extract", noting)
    envcache.restore("abc123", str(machine["venv"]), machine["cache"])
    assert modes["while writing"] & 0o700 == 0o700
    assert (machine["venv"] / "d" / "f").read_bytes() == b"x\n"
    assert (machine["venv"] / "d").stat().st_mode & 0o7777 == 0o555


def test_a_restore_drops_set_id_bits_and_write_for_others_as_tarfiles_own_filter_would(machine):
    setuid = member("venv/tool", data=b"#!/bin/sh\n")
    setuid[0].mode = 0o6777
    plant(machine, [member("venv", tarfile.DIRTYPE), setuid])
    wipe(machine)
    envcache.restore("abc123", str(machine["venv"]), machine["cache"])
    assert (machine["venv"] / "tool").stat().st_mode & 0o7777 == 0o755


def test_an_entry_with_a_part_gone_is_kept_again_by_the_next_build(machine):
    venv = str(machine["venv"])
    envcache.store("abc123", venv, machine["cache"])
    delete(sorted(n for n in objects(machine) if "/parts/" in n)[0])  # a lifecycle rule, a clean-up
    with pytest.raises(envcache.Refused, match="is missing"):
        envcache.restore("abc123", venv, machine["cache"])
    assert envcache.store("abc123", venv, machine["cache"]).startswith("environment kept in")
    wipe(machine)
    assert envcache.restore("abc123", venv, machine["cache"]).startswith("environment restored from")


def run_tool(*args: str, crash_at: str = "") -> subprocess.CompletedProcess:
    """envcache.py as the setup job runs it, killed at `crash_at` (a crash point, NAME@N) if given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_RL_CRASH")}
    env |= {faults.ENV: crash_at} if crash_at else {}
    return subprocess.run([sys.executable, envcache.__file__, *args], env=env, capture_output=True, text=True)


@pytest.mark.parametrize(
    ("command", "point"),
    [
        ("store", "envcache.stored"),
        ("restore", "envcache.removed-old"),
        ("restore", "envcache.moved-into-place@1"),  # uv's Python in place, the venv not yet
        ("restore", "envcache.moved-into-place@2"),
        ("restore", "envcache.linked-python"),
    ],
)
def test_a_kill_at_each_of_its_points_loses_nothing_and_the_next_setup_restores_the_same_tree(machine, command, point):
    venv, installation, link = machine["venv"], machine["installation"], machine["link"]
    built = tree(venv, installation, link)
    args = ("abc123", str(venv), machine["cache"])
    if command == "restore":
        assert run_tool("store", *args).returncode == 0
        wipe(machine)
        venv.mkdir()
        (venv / "half-built").write_text("a build that was cut off")  # what removed-old removes
    assert run_tool(command, *args, crash_at=point).returncode == -signal.SIGKILL
    if command == "store":
        wipe(machine)
    again = run_tool("restore", *args)
    assert again.returncode == 0, again.stdout
    assert tree(venv, installation, link) == built

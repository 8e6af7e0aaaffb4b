"""install-hook's generated text and plans: hook blocks, systemd quoting, NCCL conf lines, plan/undo (no venvs)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from commdiag.install import hookplan, hooktext, systemd
from commdiag.errors import CommdiagError
from commdiag.install.hookplan import ABSENT, BLOCK, FILE, OWNED, Desired, FileState, Target

META = {"commdiag": "0.1.0", "source": "reports/x\nimport os; os.system('boom')", "installed": "2026-11-29T12:00:00Z"}
HOSTILE = ["a\nb", "a\rb", "a\0b", "a\x1bb", "x\x7f"]


def test_hook_block_is_python_and_sets_only_unset_values():
    text = hooktext.hook_block({"NCCL_PROTO": "LL", "NCCL_X": "it's \"q\" \\ %"}, override=False, meta=META)
    compile(text, "hook", "exec")
    # the newline in the source cannot end the comment: no line of the block starts with "import os"
    assert not any(l.startswith("import os") for l in text.splitlines())
    env = {"NCCL_PROTO": "Simple"}
    fake_os = type("os", (), {"environ": env})
    g = {"__builtins__": __builtins__}
    import builtins

    real_import = builtins.__import__

    def imp(name, *a, **k):
        return fake_os if name == "os" else real_import(name, *a, **k)

    g["__builtins__"] = dict(vars(builtins), __import__=imp)
    exec(text, g)
    assert env == {"NCCL_PROTO": "Simple", "NCCL_X": "it's \"q\" \\ %"}  # the user's value wins, ours arrives verbatim
    exec(hooktext.hook_block({"NCCL_PROTO": "LL"}, override=True, meta=META), g)
    assert env["NCCL_PROTO"] == "LL"
    assert hooktext.settings_in(text) == {"NCCL_PROTO": "LL", "NCCL_X": "it's \"q\" \\ %"}


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_are_rejected_everywhere(value):
    for make in (lambda: hooktext.hook_block({"NCCL_PROTO_X": value}, override=False, meta={}),
                 lambda: hooktext.nccl_conf_block({"NCCL_X": value}, meta={}),
                 lambda: systemd.quote_environment("NCCL_X", value),
                 lambda: systemd.quote_env_file("NCCL_X", value)):
        with pytest.raises(CommdiagError):
            make()
    with pytest.raises(CommdiagError):
        hooktext.check_values({"BAD NAME": "1"})


def test_blocks_are_added_replaced_and_stripped_byte_exactly():
    base = "# someone's code\nimport sys"  # no trailing newline
    block = hooktext.hook_block({"NCCL_PROTO": "LL"}, override=False, meta={})
    once = hooktext.add_block(base, block)
    assert once.startswith(base + "\n") and once.endswith(hooktext.END + "\n")
    twice = hooktext.add_block(once, hooktext.hook_block({"NCCL_PROTO": "Simple"}, override=False, meta={}))
    assert twice.count(hooktext.BEGIN) == 1 and "Simple" in twice
    assert hooktext.strip_blocks(twice) == base + "\n"
    top = hooktext.add_block("NCCL_PROTO=Simple\n", hooktext.nccl_conf_block({"NCCL_PROTO": "LL"}, meta={}), at_top=True)
    assert top.startswith(hooktext.NCCL_BEGIN) and top.endswith("NCCL_PROTO=Simple\n")


def test_nccl_conf_comments_carry_no_assignment():
    text = hooktext.nccl_conf_block({"NCCL_ALGO": "Ring"}, meta={"source": "a=b\nNCCL_PROTO=LL"})
    lines = [l for l in text.splitlines() if "=" in l]
    assert lines == ["NCCL_ALGO=Ring"]  # older NCCL releases do not skip '#' lines: no '=' in comments
    assert hooktext.settings_in(text) == {"NCCL_ALGO": "Ring"}


@pytest.mark.parametrize("value, word", [
    ("LL", '"NCCL_SOCKET_IFNAME=LL"'),
    ("a b", '"NCCL_SOCKET_IFNAME=a b"'),
    ('say "hi"', '"NCCL_SOCKET_IFNAME=say \\"hi\\""'),
    ("50%", '"NCCL_SOCKET_IFNAME=50%%"'),
    ("%h/x", '"NCCL_SOCKET_IFNAME=%%h/x"'),
    ("back\\slash", '"NCCL_SOCKET_IFNAME=back\\\\slash"'),
    ("$HOME 'q'", '"NCCL_SOCKET_IFNAME=$HOME \'q\'"'),
])
def test_systemd_environment_quoting(value, word):
    assert systemd.quote_environment("NCCL_SOCKET_IFNAME", value) == word


def test_systemd_unit_names():
    assert systemd.dropin_path("sglang") == "/etc/systemd/system/sglang.service.d/commdiag-nccl.conf"
    assert systemd.unit_name("vllm@0.service") == "vllm@0.service"
    for bad in ("../etc", "a/b", "a b", "", ".hidden"):
        with pytest.raises(CommdiagError):
            systemd.unit_name(bad)


VALUES = {"NCCL_A": "plain", "NCCL_B": "two words", "NCCL_C": 'q"uote', "NCCL_D": "back\\slash",
          "NCCL_E": "$HOME`x`", "NCCL_F": "50%", "NCCL_G": "it's"}


def test_env_file_round_trips_through_sh(tmp_path):
    path = tmp_path / "x.env"
    path.write_text(systemd.env_file_text(VALUES, meta=META))
    out = subprocess.run(["sh", "-c", f"set -a; . {path}; env -0"], capture_output=True, check=True,
                         env={"PATH": os.environ["PATH"]}).stdout.decode()
    got = dict(item.split("=", 1) for item in out.split("\0") if item.startswith("NCCL_"))
    assert got == VALUES


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_dropin_passes_systemd_analyze_verify(tmp_path):
    unit_dir = tmp_path / "etc/systemd/system"
    (unit_dir / "demo.service.d").mkdir(parents=True)
    (unit_dir / "demo.service").write_text("[Unit]\nDescription=demo\n[Service]\nExecStart=/bin/true\n")

    def verify(text):
        (unit_dir / "demo.service.d" / "commdiag-nccl.conf").write_text(text)
        cp = subprocess.run(["systemd-analyze", "verify", str(unit_dir / "demo.service")], capture_output=True,
                            text=True, timeout=60, env={**os.environ, "SYSTEMD_UNIT_PATH": f"{unit_dir}:"})
        return [l for l in cp.stderr.splitlines() if "commdiag-nccl.conf" in l]

    assert verify(systemd.dropin_text(VALUES, meta=META)) == []
    assert verify(systemd.dropin_text(VALUES, meta=META, env_file="/etc/commdiag/demo.service.env")) == []
    # the check can fail: an unquoted value with a space is reported by systemd
    assert verify("[Service]\nEnvironment=NCCL_B=two words\n") != []


# --- plans (pure) -------------------------------------------------------------------------------

def _target(text="v1", role=OWNED, path="/r/sp/hook.py"):
    return Target("python:/p", "python", "pth", (Desired(path, path, role, text),), {"settings": {}})


def test_plan_install_then_uninstall_is_exact_and_keeps_first_original():
    orig = FileState(FILE, b"theirs\n", 0o600, 5, 6, 123)
    snap = {"/r/sp/sc.py": orig, "/r/sp": FileState("dir"), "/r": FileState("dir")}
    t = _target(hooktext.hook_block({"NCCL_PROTO": "LL"}, override=False, meta={}), BLOCK, "/r/sp/sc.py")
    plan = hookplan.plan_install([t], snap, {}, force=False, meta={})
    (change,) = plan.changes
    assert change.after.mode == 0o600 and change.after.uid == 5 and change.after.data.startswith(b"theirs\n")
    record = plan.records[0]
    # reinstall over it with other settings: the record still holds the first original
    snap2 = dict(snap, **{"/r/sp/sc.py": change.after})
    t2 = _target(hooktext.hook_block({"NCCL_PROTO": "Simple"}, override=False, meta={}), BLOCK, "/r/sp/sc.py")
    plan2 = hookplan.plan_install([t2], snap2, {record["key"]: record}, force=False, meta={})
    assert FileState.from_json(plan2.records[0]["files"][0]["before"]) == orig
    undo = hookplan.plan_uninstall([plan2.records[0]], {"/r/sp/sc.py": plan2.changes[0].after}, force=False)
    assert undo.changes[0].after == orig


def test_plan_refuses_foreign_file_without_force():
    snap = {"/r/sp/hook.py": FileState(FILE, b"not ours\n", 0o644)}
    with pytest.raises(CommdiagError, match="not commdiag's"):
        hookplan.plan_install([_target()], snap, {}, force=False, meta={})
    plan = hookplan.plan_install([_target()], snap, {}, force=True, meta={})
    assert FileState.from_json(plan.records[0]["files"][0]["before"]).data == b"not ours\n"


def test_uninstall_of_a_changed_block_file_removes_only_the_block():
    block = hooktext.hook_block({"NCCL_PROTO": "LL"}, override=False, meta={})
    t = _target(block, BLOCK, "/r/sc.py")
    plan = hookplan.plan_install([t], {"/r/sc.py": FileState(FILE, b"a\n", 0o644)}, {}, force=False, meta={})
    edited = FileState(FILE, plan.changes[0].after.data + b"later = 1\n", 0o644)
    undo = hookplan.plan_uninstall(list(plan.records), {"/r/sc.py": edited}, force=False)
    assert undo.changes[0].after.data == b"a\nlater = 1\n"
    # an owned file changed since install is left alone without --force
    plan = hookplan.plan_install([_target()], {}, {}, force=False, meta={})
    undo = hookplan.plan_uninstall(list(plan.records), {"/r/sp/hook.py": FileState(FILE, b"edited", 0o644)}, force=False)
    assert undo.changes == () and undo.warnings
    undo = hookplan.plan_uninstall(list(plan.records), {"/r/sp/hook.py": FileState(FILE, b"edited", 0o644)}, force=True)
    assert undo.changes[0].after.kind == ABSENT


def test_installed_settings_reads_the_first_hook_on_the_path(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "sitecustomize.py").write_text("x = 1\n" + hooktext.hook_block({"NCCL_ALGO": "Tree"}, override=False, meta={}))
    (b / (hooktext.HOOK_MODULE + ".py")).write_text(hooktext.hook_block({"NCCL_PROTO": "LL"}, override=False, meta={}))
    assert hooktext.installed_settings([str(b), str(a)]) == {"NCCL_PROTO": "LL"}
    assert hooktext.installed_settings([str(a), str(b)]) == {"NCCL_ALGO": "Tree"}
    assert hooktext.installed_settings([str(tmp_path)]) == {}


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS"}


def test_shipped_templates_match_what_install_hook_writes(tmp_path):
    with open(os.path.join(REPO, "systemd", "commdiag-nccl.conf.example")) as f:
        template = [l for l in f.read().splitlines() if l.startswith(("[", "Environment="))]
    generated = [l for l in systemd.dropin_text(SHIPPED, meta={}).splitlines() if l.startswith(("[", "Environment="))]
    assert template == generated
    out = subprocess.run(["sh", "-c", f"set -a; . {os.path.join(REPO, 'systemd', 'nccl.env.example')}; env -0"],
                         capture_output=True, check=True, env={"PATH": os.environ["PATH"]}).stdout.decode()
    assert {k: v for k, v in (i.split("=", 1) for i in out.split("\0") if i.startswith("NCCL_"))} == SHIPPED
    with open(os.path.join(REPO, "systemd", "nccl.env.example")) as f:
        assert [l for l in f.read().splitlines() if not l.startswith("#")] == \
               [l for l in systemd.env_file_text(SHIPPED, meta={}).splitlines() if not l.startswith("#")]

"""The ACS/IOMMU audit: config-space decoding held to lspci, constructed sysfs trees in the kernel's
layout (tests/sysfs_tree.py), the real tree of the H200 machine, hostile trees, the capture, the CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from commdiag import linewrap
from commdiag.environment import doctor, pciconfig, pcie, pcieadvice, sysfscapture
from commdiag.environment.sysfs import MAX_ENTRIES, SysfsTree
from commdiag.errors import CommdiagError
from conftest import run_cli
from sysfs_tree import (ACS_KERNEL, BRIDGE, GPU_CLASS, NV, Tree, config_space, root_ports_box, switch_box,
                        two_socket_box)

FIX = Path(__file__).parent / "fixtures" / "pcie"
H200_DETECT = Path(__file__).parent / "fixtures" / "h200x1" / "detect.json"


# --------------------------------------------------------------------------- config space vs lspci


def _dump(text: str) -> dict[str, bytes]:
    """``lspci -xxxx`` text -> bus id -> config bytes."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^([0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ", line)
        if m:
            cur = out.setdefault(m.group(1), bytearray())
        elif re.match(r"^[0-9a-f]{2,3}: ", line):
            cur.extend(bytes.fromhex(line.split(": ", 1)[1]))
    return {k: bytes(v) for k, v in out.items()}


def _lspci_blocks(text: str) -> dict[str, list[str]]:
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^([0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ", line)
        if m:
            cur = out.setdefault(m.group(1), [])
        elif cur is not None:
            cur.append(line)
    return out


LSPCI_PORT = {"Root Port": "root port", "Upstream Port": "switch upstream port",
              "Downstream Port": "switch downstream port", "Endpoint": "endpoint"}


def test_acs_bits_ext_caps_and_port_type_match_lspci_on_constructed_and_real_config_space():
    configs = _dump((FIX / "lspci-dump.txt").read_text())
    blocks = _lspci_blocks((FIX / "lspci-F-vvv.txt").read_text())
    assert set(configs) == set(blocks) and len(configs) == 7
    assert configs["00:06.0"] == (FIX / "h200x1-vm-config.bin").read_bytes()
    seen_acs = 0
    for bdf, cfg in configs.items():
        lines = blocks[bdf]
        # every extended capability lspci lists, at the same offset and version, in the same order
        theirs = [(int(o, 16), int(v)) for o, v in (re.match(r"\s+Capabilities: \[([0-9a-f]{3}) v(\d+)\]", l).groups()
                                                    for l in lines if re.match(r"\s+Capabilities: \[[0-9a-f]{3} v", l))]
        assert [(c.offset, c.version) for c in pciconfig.ext_capabilities(cfg)] == theirs
        express = next(l for l in lines if "Express (v2)" in l)
        assert pciconfig.port_type(cfg) == next(v for k, v in LSPCI_PORT.items() if k in express)
        ctl = [l.strip() for l in lines if "ACSCtl:" in l]
        cap = [l.strip() for l in lines if "ACSCap:" in l]
        acs = pciconfig.acs(cfg)
        if ctl:
            seen_acs += 1
            assert acs.lspci() == ctl[0]  # tab and all
            assert "ACSCap:\t" + pciconfig.flags(acs.capability) == cap[0]
        else:
            assert acs is None
    assert seen_acs == 5
    real = pciconfig.ext_capabilities(configs["00:06.0"])
    assert [hex(c.id) for c in real][:4] == ["0x0", "0x18", "0x0", "0x1"]  # Null, LTR, Null, AER (as lspci)


def test_acs_states_and_which_bits_redirect():
    def acs(ctl):
        return pciconfig.acs(config_space(0x1000, 0xC010, BRIDGE, port_type=6, acs_ctl=ctl, acs_cap=0x7F))
    assert acs(ACS_KERNEL).redirecting == ["ReqRedir", "CmpltRedir"]
    assert acs(0x20).redirecting == ["EgressCtrl"]
    assert acs(0x01).redirecting == [] and acs(0x01).enabled()["SrcValid"]
    assert acs(0).enabled() == dict.fromkeys(pciconfig.ACS_BITS, False)
    assert pciconfig.access(config_space(NV, 1, GPU_CLASS, size=64)) == "header-only"
    assert pciconfig.port_type(config_space(NV, 1, GPU_CLASS, size=64)) is None  # the capability is past 64
    assert pciconfig.acs(config_space(0x1000, 1, BRIDGE, acs_ctl=0x1D, size=256)) is None


def test_garbage_and_looping_capability_lists_end():
    cfg = bytearray(config_space(0x1000, 1, BRIDGE, acs_ctl=0x1D))
    cfg[0x100:0x104] = (0x0001 | 1 << 16 | 0x100 << 20).to_bytes(4, "little")  # points to itself
    cfg[0x61] = 0x40  # the PCIe capability points back to power management: a loop
    cfg[0x60] = 0x05
    t = time.monotonic()
    assert [c.offset for c in pciconfig.ext_capabilities(bytes(cfg))] == [0x100]
    assert pciconfig.port_type(bytes(cfg)) is None
    noise = bytes((i * 7919 + 13) % 251 for i in range(4096))
    pciconfig.ext_capabilities(noise), pciconfig.port_type(noise), pciconfig.acs(noise)
    assert pciconfig.ext_capabilities(b"\xff" * 4096) == [] and pciconfig.acs(b"") is None
    assert time.monotonic() - t < 1


# --------------------------------------------------------------------------- constructed trees


def test_switch_with_acs_on_and_a_translating_iommu(tmp_path):
    switch_box(tmp_path, acs_ctl=ACS_KERNEL, iommu="DMA", cmdline="BOOT_IMAGE=/vmlinuz intel_iommu=on quiet")
    a = pcie.audit(str(tmp_path), nvml_bus_ids=["00000000:03:00.0", "00000000:04:00.0"])
    assert a.iommu.mode == pcie.TRANSLATED and a.iommu.units == ["dmar0"] and a.iommu.groups == 6
    assert a.iommu.cmdline == ["intel_iommu=on"]
    g0, g1 = a.gpus
    assert (g0.label, g0.bdf, g0.host_bridge, g0.iommu_group, g0.iommu_type) == ("GPU0", "0000:03:00.0",
                                                                                 "pci0000:00", "4", "DMA")
    assert [(h.bdf, h.kind, h.kind_from) for h in g0.hops] == [
        ("0000:00:01.0", "root port", "config"), ("0000:01:00.0", "switch upstream port", "config"),
        ("0000:02:00.0", "switch downstream port", "config"), ("0000:03:00.0", "GPU", "class")]
    assert [h.acs_state for h in g0.hops] == [pcie.ACS_REDIRECT, pcie.ACS_ABSENT, pcie.ACS_REDIRECT, None]
    assert (g0.hops[-1].link.gen, g0.hops[-1].link.max_gen, g0.hops[-1].link.speed) == (1, 5, "2.5 GT/s PCIe")
    (p,) = a.pairs
    assert (p.label, p.meeting, p.meeting_kind, p.verdict) == ("GPU0-GPU1", "0000:01:00.0", "bridge", "redirected")
    assert p.between == ["0000:02:00.0", "0000:02:01.0"]  # the root port above the meeting point is not between
    assert p.redirecting == {"0000:02:00.0": ["ReqRedir", "CmpltRedir"], "0000:02:01.0": ["ReqRedir", "CmpltRedir"]}
    recs = {r["check"]: r for r in pcieadvice.records(a) if r["severity"] == "warning"}
    assert set(recs) == {"iommu", "acs"}
    assert "ACSCtl: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+" in recs["acs"]["evidence"]
    assert "redirecting all PCI point-to-point traffic to the CPU root complex" in recs["acs"]["evidence"]
    assert "ECAP_ACS+0x6.w=0000" in recs["acs"]["action"] and "iommu=pt" in recs["iommu"]["action"]
    text = linewrap.fit("\n".join(pcieadvice.render(a))).split("\n")  # as the CLI prints it
    assert max(map(len, text)) <= 100
    assert any("GPU0-GPU1: meet at 0000:01:00.0; 2 bridges between; ACS redirect on at 0000:02:00.0" in l
               for l in text)
    json.dumps(a.to_json())


@pytest.mark.parametrize("ctl, state, verdict", [(0, pcie.ACS_OFF, "not redirected"),
                                                 (None, pcie.ACS_ABSENT, "not redirected"),
                                                 (0x01, pcie.ACS_ON, "not redirected"),
                                                 (0x20, pcie.ACS_REDIRECT, "redirected")])
def test_switch_with_acs_off_absent_source_validation_or_egress_control(tmp_path, ctl, state, verdict):
    switch_box(tmp_path, acs_ctl=ctl, iommu=None)
    a = pcie.audit(str(tmp_path))
    assert a.iommu.mode == pcie.OFF and a.iommu.groups == 0
    assert a.gpus[0].label == "0000:03:00.0" and a.gpus[0].iommu_group is None  # no NVML: named by bus id
    assert a.bridges()["0000:02:00.0"].acs_state == state
    assert a.pairs[0].verdict == verdict
    acs = [r for r in pcieadvice.records(a) if r["check"] == "acs"]
    if verdict == "redirected":
        assert acs[0]["severity"] == "warning" and "EgressCtrl+" in acs[0]["evidence"]
    else:
        assert [(r["severity"], r["title"]) for r in acs] == [
            ("ok", "ACS redirects no peer traffic (2 bridge(s) between GPUs read)")]


def test_gpus_under_different_root_ports_and_host_bridges_with_iommu_pt(tmp_path):
    root_ports_box(tmp_path)
    a = pcie.audit(str(tmp_path))
    assert a.iommu.mode == pcie.PASSTHROUGH and a.iommu.cmdline == ["amd_iommu=on", "iommu=pt"]
    assert a.iommu.units == ["ivhd0", "ivhd1"]
    assert [(p.meeting, p.meeting_kind, p.between) for p in a.pairs] == [
        ("pci0000:00", "host bridge", ["0000:00:01.1", "0000:00:03.1"]),
        (None, "different host bridges", ["0000:00:01.1", "0000:40:01.1"]),
        (None, "different host bridges", ["0000:00:03.1", "0000:40:01.1"])]
    assert all(p.verdict == "redirected" for p in a.pairs)  # the root ports carry the kernel's ACS bits
    assert [h.kind_from for h in a.gpus[0].hops] == ["config", "class"]
    recs = pcieadvice.records(a)
    assert [r["severity"] for r in recs if r["check"] == "iommu"] == ["ok"]
    assert any("under different host bridges" in l for l in pcieadvice.render(a))


def test_no_permission_to_read_config_space_says_so_with_the_exact_command(tmp_path):
    switch_box(tmp_path, acs_ctl=ACS_KERNEL, iommu=None, config_size=64)  # what a non-root reader gets
    a = pcie.audit(str(tmp_path))
    assert {h.acs_state for h in a.bridges().values()} == {pcie.ACS_NEEDS_ROOT}
    # without the PCIe capability, the kind comes from where the bridge sits
    assert [(h.kind, h.kind_from) for h in a.gpus[0].bridges] == [
        ("root port", "position"), ("switch upstream port", "position"), ("switch downstream port", "position")]
    (p,) = a.pairs
    assert p.verdict == "ACS unread" and p.unreadable == ["0000:02:00.0", "0000:02:01.0"]
    (rec,) = [r for r in pcieadvice.records(a) if r["check"] == "acs"]
    assert rec["severity"] == "info" and "first 64 bytes" in rec["evidence"]
    assert "`sudo lspci -vvv -s 0000:02:00.0 | grep -i ACSCtl`" in rec["action"]
    assert 'sudo "$(command -v commdiag)" detect' in rec["action"]
    switch_box(tmp_path / "conv", acs_ctl=ACS_KERNEL, iommu=None, config_size=256)
    a = pcie.audit(str(tmp_path / "conv"))
    assert {h.acs_state for h in a.bridges().values()} == {pcie.ACS_NO_EXTENDED}


def test_iommu_modes_from_group_types_and_the_command_line(tmp_path):
    def mode(name, types, cmdline, with_type_file=True):
        t = Tree(tmp_path / name, cmdline)
        t.iommu_unit("dmar0")
        t.device("0000:00:01.0", None, vendor=0x8086, device=1, class_code=BRIDGE, acs_ctl=0)
        for n, ty in enumerate(types):
            bdf = f"0000:0{n + 1}:00.0"
            t.device(bdf, "0000:00:01.0" if n == 0 else None, vendor=NV, device=0x2BB5, class_code=GPU_CLASS,
                     group=n + 1)
            if with_type_file:
                t.group_type(n + 1, ty)
        return pcie.audit(str(tmp_path / name)).iommu
    assert mode("dma", ["DMA", "DMA"], "intel_iommu=on").mode == pcie.TRANSLATED
    assert mode("fq", ["DMA-FQ"], "intel_iommu=on iommu.strict=0").cmdline == ["intel_iommu=on", "iommu.strict=0"]
    assert mode("fq2", ["DMA-FQ"], "").mode == pcie.TRANSLATED_LAZY
    assert mode("vfio", ["unmanaged"], "intel_iommu=on").mode == pcie.ASSIGNED
    assert mode("mixed", ["DMA", "identity"], "").mode == pcie.MIXED
    # a kernel before 5.11 shows no group type: the command line decides, else it is unknown
    assert mode("old-pt", ["x"], "intel_iommu=on iommu=pt", with_type_file=False).mode == pcie.PASSTHROUGH
    assert mode("old", ["x"], "intel_iommu=on", with_type_file=False).mode == pcie.UNKNOWN
    assert pcie.kernel_options("ro iommu=pt pci=realloc=off pci=disable_acs_redir=0000:01:00.0 -- iommu=off") == [
        "iommu=pt", "pci=disable_acs_redir=0000:01:00.0"]  # after --: init's, not the kernel's


def test_group_peers_and_degraded_links(tmp_path):
    t = Tree(tmp_path)
    t.device("0000:00:01.0", None, vendor=0x8086, device=1, class_code=BRIDGE, acs_ctl=0, link=(4, 8, 4, 16),
             group=1)
    t.device("0000:01:00.0", "0000:00:01.0", vendor=NV, device=0x2BB5, class_code=GPU_CLASS, link=(4, 8, 4, 16),
             group=1)
    t.device("0000:01:00.1", "0000:00:01.0", vendor=NV, device=0x22E8, class_code=0x040300, group=1)
    t.device("0000:00:02.0", None, vendor=0x8086, device=1, class_code=BRIDGE, acs_ctl=0, link=(4, 8, 4, 16))
    t.device("0000:02:00.0", "0000:00:02.0", vendor=NV, device=0x2BB5, class_code=GPU_CLASS, link=(4, 8, 4, 8))
    for g in (1,):
        t.group_type(g, "identity")
    a = pcie.audit(str(tmp_path))
    assert a.gpus[0].group_peers == ["0000:00:01.0 PCI bridge", "0000:01:00.1 class 0x040300"]
    # a capture without the group's devices/ (benchmarks' gpu_capture.py makes those): asked per device
    shutil.rmtree(tmp_path / "sys/kernel/iommu_groups/1/devices")
    assert pcie.audit(str(tmp_path)).gpus[0].group_peers == a.gpus[0].group_peers
    # 0000:01:00.0 runs x8 where both ends allow x16; an x16 slot holding an x8 card is no fault
    assert [(h.bdf, allowed) for _, h, allowed in pcieadvice.degraded_links(a)] == [
        ("0000:00:01.0", 16), ("0000:01:00.0", 16)]
    warn = [r for r in pcieadvice.records(a) if r["check"] == "pcie link" and r["severity"] == "warning"]
    assert len(warn) == 2 and "runs x8 where both ends allow x16" in warn[0]["title"]


def test_eight_gpus_on_two_sockets_a_matrix_within_100_columns(tmp_path):
    two_socket_box(tmp_path)
    a = pcie.audit(str(tmp_path), nvml_bus_ids=[f"00000000:{b:02x}:00.0" for b in (3, 4, 5, 6, 0x43, 0x44, 0x45,
                                                                                    0x46)])
    assert len(a.pairs) == 28
    verdicts = {p.label: p.verdict for p in a.pairs}
    # only GPU pairs behind the same switch whose downstream ports both have ACS off go direct
    assert sorted(k for k, v in verdicts.items() if v == "not redirected") == ["GPU2-GPU3", "GPU6-GPU7"]
    text = linewrap.fit("\n".join(pcieadvice.render(a))).split("\n")  # as the CLI prints it
    assert max(map(len, text)) <= 100
    at = text.index("  GPU pairs, ACS between them: REDIR redirected, ok not redirected, root? needs root, - no bridge")
    assert text[at + 1].split() == [f"GPU{i}" for i in range(8)]
    assert text[at + 4].split() == ["GPU2", "REDIR", "REDIR", "X", "ok", "REDIR", "REDIR", "REDIR", "REDIR"]
    joined = " ".join(l.strip() for l in text[at:])
    assert "meet at 0000:01:00.0: GPU0-GPU1, GPU0-GPU2, GPU0-GPU3, GPU1-GPU2, GPU1-GPU3, GPU2-GPU3" in joined
    assert "under different host bridges (CPU sockets or root complexes): GPU0-GPU4" in joined
    (warn,) = [r for r in pcieadvice.records(a) if r["check"] == "acs"]
    assert warn["title"] == "ACS redirects peer-to-peer traffic between 26 of 28 GPU pair(s) to the root complex"
    assert warn["evidence"].startswith("ACSCtl: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- "
                                       "DirectTrans- on 0000:00:01.1 (root port), 0000:02:00.0 (switch downstream")
    (link,) = [r for r in pcieadvice.records(a) if r["check"] == "pcie link" and r["severity"] == "warning"]
    assert link["title"] == "GPU5 0000:44:00.0: link runs x8 where both ends allow x16"


def test_a_gpu_behind_intel_vmd_a_second_host_bridge_inside_a_device(tmp_path):
    t = Tree(tmp_path)
    t.device("0000:00:0e.0", None, vendor=0x8086, device=0x28C0, class_code=0x010400, size=64)
    vmd = t.dirs["0000:00:0e.0"] / "pci10000:e0"
    vmd.mkdir()
    t.dirs["pci10000:e0"] = vmd
    t.device("10000:e0:06.0", "pci10000:e0", vendor=0x8086, device=0x464D, class_code=BRIDGE, size=64)
    t.device("10000:e1:00.0", "10000:e0:06.0", vendor=NV, device=0x2BB5, class_code=GPU_CLASS, size=64)
    (g,) = pcie.audit(str(tmp_path)).gpus
    assert g.host_bridge == "pci0000:00"
    assert [(h.bdf, h.kind, h.kind_from) for h in g.hops] == [
        ("0000:00:0e.0", "class 0x010400", "class"), ("10000:e0:06.0", "root port", "position"),
        ("10000:e1:00.0", "GPU", "class")]


# --------------------------------------------------------------------------- the real tree of the GPU machine


def test_real_h200_vm_tree_gpu_on_the_root_bus_no_iommu():
    readings = json.loads(H200_DETECT.read_text())["nvml_readings"]
    a = pcie.audit(str(FIX / "h200x1-vm"), nvml_bus_ids=[g["bus"] for g in readings["gpus"]])
    assert a.available and not a.problems
    (g,) = a.gpus
    assert (g.label, g.bdf, g.host_bridge, g.iommu_group) == ("GPU0", "0000:00:06.0", "pci0000:00", None)
    (h,) = g.hops
    assert (h.kind, h.vendor, h.device, h.class_code) == ("GPU", "0x10de", "0x2335", "0x030200")
    # what NVML read there: gen5 x16 of gen5 x16
    nv = readings["gpus"][0]
    assert (h.link.gen, h.link.width, h.link.max_gen, h.link.max_width) == (
        nv["pcie_gen"], nv["pcie_width"], nv["pcie_gen_max"], nv["pcie_width_max"]) == (5, 16, 5, 16)
    assert h.link.speed == "32.0 GT/s PCIe"
    assert (a.iommu.mode, a.iommu.units, a.iommu.groups, a.iommu.cmdline) == (pcie.OFF, [], 0, [])
    assert a.pairs == []
    assert [(r["severity"], r["check"]) for r in pcieadvice.records(a)] == [("ok", "iommu"), ("ok", "acs")]
    assert "    on the root bus: no root port or switch above it (typical of a VM)" in pcieadvice.render(a)


# --------------------------------------------------------------------------- hostile trees


def test_symlink_loops_huge_files_fifos_and_odd_names_are_skipped_never_hang(tmp_path):
    switch_box(tmp_path, acs_ctl=0, iommu=None)
    devs = tmp_path / "sys/bus/pci/devices"
    os.symlink("0000:09:00.0", devs / "0000:09:00.0")  # a link to itself
    os.symlink("0000:0b:00.0", devs / "0000:0a:00.0")  # two links to each other
    os.symlink("0000:0a:00.0", devs / "0000:0b:00.0")
    os.symlink("/etc", devs / "0000:0c:00.0")  # absolute: read inside the root, never the host's /etc
    (devs / "\x1b]0;pwned\x07").mkdir()
    big = tmp_path / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/class"
    with open(big, "wb") as f:  # 1 GiB, sparse: only the first page is ever read
        f.truncate(1 << 30)
    fifo = tmp_path / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/config"
    fifo.unlink()
    os.mkfifo(fifo)  # opening a FIFO for reading would block until a writer comes
    groups = tmp_path / "sys/kernel/iommu_groups"
    for n in range(MAX_ENTRIES + 10):
        (groups / str(n)).mkdir()
    gpu = tmp_path / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0"
    (gpu / "current_link_speed").write_bytes(b"\x00\xff16.0 GT/s PCIe\n")
    (gpu / "current_link_width").write_text("99999\n")
    (tmp_path / "proc/cmdline").write_bytes(b"iommu=pt\x1b[2J \xff\xfe intel_iommu=on" + b" x" * 100000)
    t = time.monotonic()
    a = pcie.audit(str(tmp_path))
    assert time.monotonic() - t < 10
    assert [g.bdf for g in a.gpus] == ["0000:03:00.0", "0000:04:00.0"]  # the rest of the tree still audited
    assert any("more than 40 symbolic links" in p for p in a.problems)
    assert any("not a regular file" in p for p in a.problems)
    assert any(f"more than {MAX_ENTRIES} entries" in p for p in a.problems)
    assert a.bridges()["0000:02:01.0"].acs_state == pcie.ACS_UNREADABLE
    assert a.bridges()["0000:01:00.0"].class_code is None  # 1 GiB of zeros is no class code
    assert (a.gpus[0].hops[-1].link.gen, a.gpus[0].hops[-1].link.width) == (None, None)  # garbage: not read
    assert a.iommu.groups == MAX_ENTRIES and a.iommu.cmdline == ["iommu=pt\x1b[2J", "intel_iommu=on"]
    assert SysfsTree(str(tmp_path)).resolve("sys/bus/pci/devices/0000:0c:00.0") is None  # no etc/ in the root
    recs = pcieadvice.records(a)
    assert any(r["check"] == "pcie sysfs" for r in recs)


_OPENS: list | None = None


def _record_opens(event, args):
    if event == "open" and _OPENS is not None:
        _OPENS.append(args)


sys.addaudithook(_record_opens)


def test_the_audit_opens_every_file_read_only(tmp_path):
    """detect and doctor run as root on serving machines: the audit must never open for writing."""
    global _OPENS
    switch_box(tmp_path, acs_ctl=ACS_KERNEL, iommu="DMA")
    _OPENS = []
    try:
        a = pcie.audit(str(tmp_path))
        pcieadvice.records(a), pcieadvice.render(a)
        opens, _OPENS = _OPENS, None
    finally:
        _OPENS = None
    files = [path for path, mode, flags in opens if str(path).startswith(str(tmp_path))]
    assert len(files) > 20  # every attribute and config file went through here
    write = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    assert [(p, m, f) for p, m, f in opens if (f or 0) & write or (m and any(c in str(m) for c in "wax+"))] == []


def test_a_tree_with_thousands_of_gpus_is_cut_not_squared(tmp_path):
    t = Tree(tmp_path)
    for n in range(300):
        t.device(f"0000:{n // 32 + 1:02x}:{n % 32:02x}.0", None, vendor=NV, device=0x2BB5, class_code=GPU_CLASS,
                 config=b"")
    start = time.monotonic()
    a = pcie.audit(str(tmp_path))
    assert len(a.gpus) == pcie.MAX_GPUS and len(a.pairs) == pcie.MAX_GPUS * (pcie.MAX_GPUS - 1) // 2
    assert a.problems == [f"300 NVIDIA GPUs in sysfs: only the first {pcie.MAX_GPUS} audited"]
    assert time.monotonic() - start < 20


def test_no_sysfs_at_all(tmp_path):
    a = pcie.audit(str(tmp_path))
    assert not a.available and "no sys/bus/pci/devices" in a.reason
    assert pcieadvice.records(a)[0]["severity"] == "info"
    assert pcieadvice.render(a)[1].startswith("  unavailable: no sys/bus/pci/devices under ")


# --------------------------------------------------------------------------- capture


def test_capture_copies_exactly_what_the_audit_reads_and_reads_back_the_same(tmp_path):
    src = tmp_path / "live"
    t = switch_box(src, acs_ctl=ACS_KERNEL, iommu="DMA",
                   cmdline="BOOT_IMAGE=/vmlinuz root=UUID=secret-ish ro intel_iommu=on iommu.strict=1 quiet")
    (t.dirs["0000:01:00.0"] / "config").write_bytes(
        config_space(0x1000, 0xC010, BRIDGE, port_type=5, dsn=0x0123456789ABCDEF))
    (t.dirs["0000:03:00.0"] / "unrelated_attribute").write_text("not copied\n")
    before = pcie.audit(str(src))
    c = sysfscapture.capture(str(tmp_path / "report"), str(src))
    after = pcie.audit(str(tmp_path / "report"))
    strip = lambda j: {k: v for k, v in j.items() if k != "root"}  # noqa: E731
    assert strip(after.to_json()) == strip(before.to_json()) == strip(c.audit.to_json())
    out = tmp_path / "report"
    assert (out / "proc/cmdline").read_text() == "intel_iommu=on iommu.strict=1\n"
    assert not list(out.rglob("unrelated_attribute"))
    usp = out / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/config"
    assert pciconfig.ext_capabilities(usp.read_bytes())[-1].id == sysfscapture.EXT_CAP_DSN
    assert usp.read_bytes()[0x184:0x18C] == bytes(8)  # the serial number is zeroed
    assert not (out / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/config").exists()
    for p in out.rglob("*"):  # every link stays inside the copy
        if p.is_symlink():
            assert os.path.realpath(p).startswith(str(out) + "/")
    with pytest.raises(CommdiagError, match="already exists"):
        sysfscapture.capture(str(out), str(src))


# --------------------------------------------------------------------------- the CLI


def test_detect_and_doctor_read_a_captured_tree(tmp_path):
    switch_box(tmp_path / "tree", acs_ctl=ACS_KERNEL, iommu="DMA", cmdline="intel_iommu=on iommu=pt\x1b]0;x\x07")
    rec = Path(__file__).parent / "fixtures" / "h200x2-nvlink" / "nvml-readings.json"
    cp = run_cli("doctor", "--sysfs-root", tmp_path / "tree", "--nvml-replay", rec, "--json", timeout=300)
    assert cp.returncode == 1, cp.stderr
    body = json.loads(cp.stdout)
    assert body["detection"]["pcie"]["format"] == "commdiag-pcie-audit" and body["detection"]["pcie"]["version"] == 1
    acs = [f for f in body["findings"] if f["check"] == "acs"]
    assert acs[0]["severity"] == "warning" and acs[0]["title"].startswith("ACS redirects peer-to-peer traffic between 1 of 1")
    cp = run_cli("detect", "--sysfs-root", tmp_path / "tree", "--capture-sysfs", tmp_path / "copy", "--nvml-replay",
                 H200_DETECT, timeout=300)
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    assert max(map(len, lines)) <= 100 and "\x1b" not in cp.stdout
    assert "ACS redirect on at 0000:02:00.0, 0000:02:01.0" in " ".join(l.strip() for l in lines)
    assert lines[0].startswith("captured ") and (tmp_path / "copy/sys/bus/pci/devices/0000:03:00.0").is_symlink()
    assert pcie.audit(str(tmp_path / "copy")).pairs[0].verdict == "redirected"


def test_doctor_records_are_findings_in_doctor_order(tmp_path):
    switch_box(tmp_path, acs_ctl=ACS_KERNEL, iommu=None, config_size=64)
    a = pcie.audit(str(tmp_path))
    found = [doctor.Finding(**r) for r in pcieadvice.records(a)]
    assert [f.check for f in found] == ["iommu", "acs", "pcie link"]

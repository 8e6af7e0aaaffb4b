"""Spec validation and resolution: every error names the file, the field and what is allowed."""

from __future__ import annotations

import pytest
import yaml

from commdiag.errors import SpecError
from commdiag.formats.spec import launch_order, load_spec

from conftest import REPO, write_spec


def error_for(tmp_path, **overrides) -> SpecError:
    path = write_spec(tmp_path / "bad.yaml", **overrides)
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert str(path) in str(e.value)
    return e.value


@pytest.mark.parametrize("overrides, field, words", [
    ({"backend": "mpi"}, "backend", "nccl, gloo"),
    ({"dtype": "int4"}, "dtype", "bfloat16"),
    ({"trials": 0}, "trials", ">= 1"),
    ({"trials": "3"}, "trials", "an integer"),
    ({"modes": ["graph"]}, "modes[0]", "gloo allows: eager"),
    ({"modes": ["fast"]}, "modes[0]", "graph, eager"),
    ({"sizes": {"tokens": [1, 2]}}, "sizes.hidden", "integer >= 1"),
    ({"sizes": {"bytes": [4097]}}, "sizes.bytes[0]", "multiple of 4"),
    ({"sizes": {"bytes": []}}, "sizes", "non-empty"),
    ({"sizes": {"hidden": 8, "tokens": [1], "rows": [1]}}, "sizes.rows", "hidden, tokens, bytes"),
    ({"configs": {"x": {"NCCL_PROTO": "LX"}}}, "configs.x.NCCL_PROTO", "LL, LL128, Simple"),
    ({"configs": {"x": {"NCCL_ALGO": "^Ring,Star"}}}, "configs.x.NCCL_ALGO", "Ring, Tree"),
    ({"configs": {"x": {"NCCL_NTHREADS": 100}}}, "configs.x.NCCL_NTHREADS", "64, 128, 256, 512"),
    ({"configs": {"x": {"NCCL_P2P_LEVEL": "FAR"}}}, "configs.x.NCCL_P2P_LEVEL", "PIX"),
    ({"configs": {"x": {"NCCL_MAX_NCHANNELS": "many"}}}, "configs.x.NCCL_MAX_NCHANNELS", "not an integer"),
    ({"configs": {"x": {"NCCL_P2P_DISABLE": True}}}, "configs.x.NCCL_P2P_DISABLE", "quote"),
    ({"configs": {"default": {}}}, "configs.default", "always added"),
    ({"grid": {"NCCL_PROTO": []}}, "grid.NCCL_PROTO", "non-empty list"),
    ({"base_env": {"NCCL_SHM_DISABLE": "2"}}, "base_env.NCCL_SHM_DISABLE", "0 or 1"),
    ({"nnodes": 2, "launch": "torchrun"}, "rdzv_endpoint", "host:port"),
    ({"nnodes": 2, "rdzv_endpoint": "nohost"}, "rdzv_endpoint", "host:port"),
    ({"nnodes": 2, "launch": "torchrun"}, "rdzv_endpoint", "hosts: [...] and node_command"),
    ({"hosts": ["a", "b"]}, "node_command", "required with hosts"),
    ({"node_command": ["ssh", "{host}"]}, "node_command", "only with hosts"),
    ({"hosts": ["a", "-oProxyCommand=x"], "node_command": ["ssh", "{host}"]}, "hosts[1]", "not starting with -"),
    ({"hosts": ["a", "a"], "node_command": ["ssh", "{host}"]}, "hosts[1]", "named twice"),
    ({"hosts": [], "node_command": ["ssh", "{host}"]}, "hosts", "empty list"),
    ({"hosts": ["a"], "nnodes": 2, "node_command": ["ssh", "{host}"]}, "hosts", "at least one host per node"),
    ({"hosts": ["a", "b"], "launch": "slurm", "node_command": ["ssh", "{host}"]}, "hosts", "only with launch: torchrun"),
    ({"hosts": ["a", "b"], "node_command": ["ssh", "{hostname}"]}, "node_command[1]", "allowed: {host}, {index}"),
    ({"hosts": ["a", "b"], "node_command": ["ssh", "{host!r}"]}, "node_command[1]", "unknown placeholder"),
    ({"hosts": ["a", "b"], "node_command": ["ssh", "node"]}, "node_command", "names no host"),
    ({"hosts": ["a", "b"], "node_command": ["ssh", "{host"]}, "node_command[1]", "literal brace"),
    ({"hosts": ["a", "b"], "node_command": []}, "node_command", "empty list"),
    ({"trails": 3}, "trails", "unknown key"),
    ({"bands": {"decode": [64, 1]}}, "bands.decode", "min 64 > max 1"),
])
def test_errors_name_field_and_allowed_values(tmp_path, overrides, field, words):
    err = error_for(tmp_path, **overrides)
    assert err.field == field
    assert words in str(err)


def test_missing_name_and_unreadable_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"backend": "gloo", "sizes": {"bytes": [4]}}))
    with pytest.raises(SpecError, match="name: required"):
        load_spec(path)
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")
    path.write_text("name: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(path)


def test_valid_nccl_forms_and_unknown_variable_is_a_warning(tmp_path):
    path = write_spec(tmp_path / "ok.yaml", configs={
        "excl": {"NCCL_PROTO": "^LL128", "NCCL_ALGO": "allreduce:Ring,Tree;broadcast:Ring"},
        "typo": {"NCCL_PROTOCOL": "LL", "OMP_NUM_THREADS": 4},
    })
    spec = load_spec(path)
    assert spec.config("excl").env == {"NCCL_PROTO": "^LL128", "NCCL_ALGO": "allreduce:Ring,Tree;broadcast:Ring"}
    assert spec.config("typo").env["OMP_NUM_THREADS"] == "4"  # non-NCCL variables pass through, as strings
    assert len(spec.warnings) == 1 and "NCCL_PROTOCOL" in spec.warnings[0] and "NCCL_PROTO" in spec.warnings[0]


def test_grid_sizes_base_env_and_overrides(tmp_path):
    path = write_spec(tmp_path / "g.yaml", base_env={"NCCL_NVLS_ENABLE": "0"},
                      sizes={"hidden": 1024, "tokens": [2, 1], "bytes": [8192, 4096]},
                      configs={"seed": {"NCCL_PROTO": "LL"}},
                      grid={"NCCL_PROTO": ["LL", "Simple"], "NCCL_ALGO": ["Ring", "Tree"]})
    spec = load_spec(path, ["trials=4", "base_env.NCCL_P2P_DISABLE=1", "dtype=float16"])
    assert spec.trials == 4 and spec.dtype == "float16"
    # tokens * hidden * 2 bytes (float16); explicit 4096 equals 2 tokens' bytes and keeps the token count
    assert [(s.bytes, s.tokens) for s in spec.sizes] == [(2048, 1), (4096, 2), (8192, None)]
    names = [c.name for c in spec.configs]
    assert names == ["default", "seed", "PROTO=LL,ALGO=Ring", "PROTO=LL,ALGO=Tree",
                     "PROTO=Simple,ALGO=Ring", "PROTO=Simple,ALGO=Tree"]
    for c in spec.configs:  # base_env reaches every config, default included
        assert c.env["NCCL_NVLS_ENABLE"] == "0" and c.env["NCCL_P2P_DISABLE"] == "1"
    assert spec.config("PROTO=Simple,ALGO=Tree").overrides == {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Tree"}


def test_set_rejects_unknown_key(tmp_path):
    with pytest.raises(SpecError, match="unknown key"):
        load_spec(write_spec(tmp_path / "s.yaml"), ["trails=5"])
    with pytest.raises(SpecError, match="KEY=VALUE"):
        load_spec(write_spec(tmp_path / "s.yaml"), ["trials"])


def test_launch_order_interleaves_rounds_and_is_seeded(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.yaml", trials=3, configs={"a": {}, "b": {}, "c": {}}))
    order = launch_order(spec, seed=7)
    assert len(order) == 12
    for trial in range(3):  # each round holds every config exactly once
        assert sorted(l.config for l in order[trial * 4:(trial + 1) * 4]) == ["a", "b", "c", "default"]
        assert {l.trial for l in order[trial * 4:(trial + 1) * 4]} == {trial}
    assert order == launch_order(spec, seed=7)
    assert any(launch_order(spec, seed=s) != order for s in range(1, 6))


@pytest.mark.parametrize("name", ["cpu-smoke.yaml", "pcie8.yaml", "nvlink2.yaml"])
def test_shipped_specs_are_valid(name):
    spec = load_spec(REPO / "sweeps" / name)
    assert not spec.warnings
    assert all(c.env.get("NCCL_NVLS_ENABLE") == "0" for c in spec.configs)  # never sweep NVLS


def test_a_bad_set_value_names_the_set_option(tmp_path):
    path = write_spec(tmp_path / "s.yaml")
    with pytest.raises(SpecError) as e:
        load_spec(path, ["trials=abc"])
    assert "--set trials=abc" in str(e.value) and e.value.field == "trials"
    with pytest.raises(SpecError) as e:  # an error in the file itself does not blame --set
        load_spec(write_spec(tmp_path / "b.yaml", dtype="int4"), ["trials=2"])
    assert "--set" not in str(e.value)


def test_hosts_and_node_command_resolve(tmp_path):
    """hosts sets nnodes and launch: torchrun; the first nnodes hosts are used; {{ }} is a literal brace;
    a resumed run's spec (run.json) comes back the same."""
    from commdiag.formats.spec import Spec

    spec = load_spec(write_spec(tmp_path / "h.yaml", nproc_per_node=1, hosts=["root@n1", "n2", "n3"],
                                node_command=["sh", "-c", "echo {{x}}; ssh {host} \"$0\"", "{index}"]))
    assert (spec.nnodes, spec.launch, spec.hosts) == (3, "torchrun", ("root@n1", "n2", "n3"))
    back = Spec.from_json(spec.to_json())
    assert (back.hosts, back.node_command, back.nnodes) == (spec.hosts, spec.node_command, 3)
    two = load_spec(write_spec(tmp_path / "h2.yaml", nnodes=2, hosts=["n1", "n2", "n3"], node_command=["ssh", "{host}"]))
    assert two.nnodes == 2 and two.rdzv_endpoint is None


"""``spec.daemon.seeding`` in the daemon pod (render/seeding.py): with Peers the daemon serves on the
pod IP's seed port, reads the peers file and the credential from read-only mounts (the ConfigMap's
optional, so a daemon may start before the first file; the Secret's not), knows its node and takes
the spec's rate, client, stream and stall settings; with Off none of it is rendered. Neither setting
is part of the daemon spec hash: changing it reloads nothing."""

from __future__ import annotations

import argparse

from builders import make
from rendered import container, daemon_command, env_of
from weightcache_contract.launch import DaemonArgs, add_daemon_arguments
from weightcache_contract.seeding import CREDENTIAL_KEY, PEERS_FILE, SEED_PORT, SEED_PORT_NAME
from weightcache_operator.render import daemon_daemonset, daemon_spec_hash

SETTINGS = {
    "mode": "Peers",
    "maxMiBPerSecond": 512.0,
    "maxClients": 3,
    "streams": 8,
    "stallSeconds": 5.0,
    "minMiBPerSecond": 2.0,
}


def _parsed(command: list[str]) -> DaemonArgs:
    parser = argparse.ArgumentParser()
    add_daemon_arguments(parser, "/run/weightcache")
    return DaemonArgs.from_namespace(parser.parse_args(command[4:]))


def test_peers_mode_gives_the_daemon_its_seed_flags_from_the_spec() -> None:
    args = _parsed(daemon_command(make(**{"daemon.seeding": SETTINGS})))

    assert args.seed_listen == f"$(POD_IP):{SEED_PORT}"
    assert args.seed_peers_file is not None and args.seed_peers_file.endswith(f"/{PEERS_FILE}")
    assert args.seed_credential_file is not None and args.seed_credential_file.endswith(f"/{CREDENTIAL_KEY}")
    assert (args.seed_max_mib_s, args.seed_max_clients, args.seed_streams) == (512.0, 3, 8)
    assert (args.seed_stall_seconds, args.seed_min_mib_s) == (5.0, 2.0)
    assert args.node_name == "$(NODE_NAME)"


def test_peers_mode_mounts_the_peers_file_and_the_credential_read_only_and_names_the_seed_port() -> None:
    ds = daemon_daemonset(make())
    daemon = container(ds, "daemon")
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}

    assert volumes["weightcache-seed-peers"]["configMap"] == {"name": "tiny-seed-peers", "optional": True}
    assert volumes["weightcache-seed-credential"]["secret"] == {"secretName": "tiny-seeding", "optional": False}
    mounts = [m for m in daemon["volumeMounts"] if m["name"] in volumes and m["name"].startswith("weightcache-seed")]
    assert len(mounts) == 2 and all(m["readOnly"] for m in mounts)
    assert {"name": SEED_PORT_NAME, "containerPort": SEED_PORT, "protocol": "TCP"} in daemon["ports"]
    assert "NODE_NAME" in env_of(daemon)
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert list(annotations) == ["weightcache.io/daemon-spec-hash"], "no checksum of the peers file or Secret"


def test_off_renders_no_seed_flag_volume_port_or_node_name() -> None:
    ds = daemon_daemonset(make(**{"daemon.seeding": {"mode": "Off"}}))
    daemon = container(ds, "daemon")

    assert not [arg for arg in daemon["command"] if arg.startswith(("--seed", "--node-name"))]
    assert not [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"].startswith("weightcache-seed")]
    assert [p["name"] for p in daemon["ports"]] == ["status"]
    assert "NODE_NAME" not in env_of(daemon)


def test_seeding_settings_leave_the_daemon_spec_hash_alone() -> None:
    assert daemon_spec_hash(make(**{"daemon.seeding": SETTINGS})) == daemon_spec_hash(make())
    assert daemon_spec_hash(make(**{"daemon.seeding": {"mode": "Off"}})) == daemon_spec_hash(make())

"""Seeding's settings fail before anything starts: serving or fetching without the credential, a
key too short to be one, an unreadable key, a peers file that is not one."""

import argparse

import pytest
from weightcache.daemon.command import add_arguments, seeding_fields
from weightcache.seeding.client import read_peers
from weightcache.seeding.messages import read_credential
from weightcache_contract.errors import WeightCacheError


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--model", "/m", "--name", "n", *argv])


@pytest.mark.parametrize("flag", ["--seed-listen=127.0.0.1:9410", "--seed-peers-file=/p.json"])
def test_serving_or_fetching_without_the_credential_is_refused_naming_the_flag(flag: str) -> None:
    with pytest.raises(WeightCacheError, match="need --seed-credential-file"):
        seeding_fields(parsed(flag))


def test_local_rank_i_listens_on_the_base_port_plus_i() -> None:
    fields = seeding_fields(parsed("--seed-listen=10.0.0.1:9410", "--seed-credential-file=/k", "--local-index=3"))
    assert fields["seed_listen"] == ("10.0.0.1", 9413)
    assert "seed" not in fields  # serving only: no peers file, no fetching


def test_fewer_than_one_stream_is_refused() -> None:
    with pytest.raises(WeightCacheError, match="--seed-streams"):
        seeding_fields(parsed("--seed-streams=0"))


def test_a_short_or_missing_key_is_refused(tmp_path) -> None:
    short = tmp_path / "short"
    short.write_bytes(b"x" * 31)
    with pytest.raises(WeightCacheError, match="holds 31 bytes; it needs at least 32"):
        read_credential(str(short))
    with pytest.raises(WeightCacheError, match="mount the cache's seeding Secret"):
        read_credential(str(tmp_path / "absent"))
    exact = tmp_path / "exact"
    exact.write_bytes(b"\n" * 32)  # whitespace is key material too
    assert read_credential(str(exact)) == b"\n" * 32


def test_an_absent_or_unreadable_peers_file_lists_no_peers(tmp_path) -> None:
    assert read_peers(str(tmp_path / "absent.json")).peers == []
    garbage = tmp_path / "garbage.json"
    garbage.write_text('{"peers": [{"node": 3}]}')
    assert read_peers(str(garbage)).peers == []


def test_the_settings_come_from_what_the_parser_made_of_any_spelling() -> None:
    # Spellings no producer writes: a prefix argparse completes, values as separate words.
    fields = seeding_fields(
        parsed("--seed-peers", "/peers.json", "--seed-cred=/k", "--seed-str", "8", "--node-name", "node-b")
    )
    settings = fields["seed"]
    assert (settings.peers_file, settings.credential_file, settings.streams, settings.node_name) == (
        "/peers.json",
        "/k",
        8,
        "node-b",
    )

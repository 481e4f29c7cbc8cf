"""``psworker train``: a small --help in sections, a --config file of every other setting under
the flags, and every wrong key, type or value refused (exit 2, naming it) before anything connects.

127.0.0.1:9 (discard) is never contacted: the settings are checked first."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from pstasks.cli import TRAIN_FLAG_KEYS, main, read_run_config, train_command
from pstasks.run_config import DEFAULT_UNTIL_CLOCK, worker_run_config

SERVER = ["train", "--server", "127.0.0.1:9"]


def _options(command: click.Command) -> list[str]:
    help_option = command.get_help_option(click.Context(command))
    return [param.name or "" for param in command.params if param is not help_option]


def test_the_help_shows_at_most_16_options_in_sections() -> None:
    assert len(_options(train_command)) <= 16
    text = CliRunner().invoke(main, ["train", "--help"]).output
    for heading in ("Servers:", "Task & data:", "Worker:", "Output & configuration:"):
        assert heading in text
    listed = text[text.index("Servers:") : text.index("Other:")]
    assert all(f"  {param.opts[0]} " in listed for param in train_command.params if param.name != "help")


def test_every_flag_has_a_key_in_the_file() -> None:
    assert set(_options(train_command)) - {"config_file"} == set(TRAIN_FLAG_KEYS)


def _run(tmp_path: Path, text: str, *flags: str) -> click.testing.Result:
    config = tmp_path / "worker.toml"
    config.write_text(text)
    return CliRunner().invoke(main, [*SERVER, "--config", str(config), *flags])


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("seed = 1\n", "unknown key seed; valid keys here:"),
        ("[train]\nsede = 1\n", "unknown key train.sede"),
        ("[train.client]\nkeepalive = 30\n", "unknown key train.client.keepalive"),
        ("[train]\neval_every = 'often'\n", "train.eval_every must be a whole number, not 'often'"),
        ("[train]\nprogress = 1\n", "train.progress must be true or false"),
        ("[train]\nshard_data = [0]\n", "train.shard_data must be a list of 2"),
        ("[train.client]\nchunk_bytes = 'big'\n", "train.client.chunk_bytes must be a whole number of bytes"),
        ("[train.client]\nchunk_bytes = '1KiB'\n", "chunk_bytes: a chunk of 1024 bytes is below the smallest"),
        ("[train.client]\nkeepalive_seconds = 0.5\n", "keepalive interval of 0.5 s is below"),
        ("[train.client.deadlines]\nmin_bytes_per_second = 0\n", "a deadline needs a positive allowance and rate"),
        ("[train.client]\npull_dtype = 'int8'\n", "is for pushes only"),
        ("[train]\nencode_on = 'gpu'\n", "encode_on 'gpu' is not one of device, host"),
        ("[train]\nstep_seconds = 0\n", "step_seconds must be positive, not 0"),
        ("[train]\nshard_data = [4, 4]\n", "shard_data [4, 4]: give [INDEX, COUNT] with 0 <= INDEX < COUNT"),
        ("torch_threads = 0\n", "torch_threads must be at least 1, not 0"),
        ("[train\n", "is not valid TOML"),
    ],
)
def test_a_wrong_key_type_or_value_in_the_file_exits_2_naming_it(tmp_path: Path, text: str, says: str) -> None:
    result = _run(tmp_path, text)
    assert result.exit_code == 2, result.output
    output = " ".join(result.output.split())
    assert "--config" in output and says in output, output


def test_mutual_tls_files_from_the_file_are_checked(tmp_path: Path) -> None:
    result = _run(tmp_path, f"[train.client.tls]\nca = '{tmp_path / 'missing.crt'}'\n")
    assert result.exit_code == 2 and "--tls-ca: cannot read" in result.output, result.output


def test_without_servers_the_command_says_where_to_give_them() -> None:
    result = CliRunner().invoke(main, ["train"])
    assert result.exit_code == 2 and "give --server HOST:PORT" in result.output, result.output


@pytest.mark.parametrize("flags", [["--pull-dtype", "int8"], ["--step-time", "1"], ["--chunk-size", "1MiB"]])
def test_settings_moved_to_the_file_are_no_flags(flags: list[str]) -> None:
    result = CliRunner().invoke(main, [*SERVER, *flags])
    assert result.exit_code == 2 and "No such option" in result.output


def test_int8_pulls_through_wire_dtype_are_a_usage_error() -> None:
    result = CliRunner().invoke(main, [*SERVER, "--wire-dtype", "int8"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "--wire-dtype" in text and "is for pushes only" in text, text


def test_flags_override_the_file_and_the_rest_comes_from_it(tmp_path: Path) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(
        "task = 'fashion'\ntorch_threads = 2\n"
        "[train]\nservers = ['10.0.0.1:1']\nslowdown = 3.0\nseed = 7\nmax_steps = 5\n"
        "[train.client]\nwire_dtype = 'bf16'\nchunk_bytes = '512KiB'\n[train.client.retry]\ngive_up_seconds = 9\n"
    )
    flags = ["--server", "127.0.0.1:9", "--slowdown", "2", "--push-dtype", "int8", "--config", str(config)]
    ctx = train_command.make_context("train", flags)
    run = read_run_config(ctx, config, {k: v for k, v in ctx.params.items() if k != "config_file"})
    train, client = run.train, run.train.client
    assert (run.task, run.torch_threads, train.servers, train.slowdown) == ("fashion", 2, ("127.0.0.1:9",), 2.0)
    assert (train.seed, train.max_steps, train.until_clock) == (7, 5, None)
    assert (client.wire_dtype, client.push_dtype, client.chunk_bytes) == ("bf16", "int8", 512 * 1024)
    assert client.retry.give_up_seconds == 9


def test_without_a_stopping_rule_the_run_stops_at_the_default_clock() -> None:
    run = worker_run_config({"train": {"servers": ["127.0.0.1:9"]}})
    assert run.train.until_clock == DEFAULT_UNTIL_CLOCK
    assert worker_run_config({"train": {"servers": ["a:1"], "max_seconds": 3}}).train.until_clock is None

"""The reference peer's worker process answers a command it cannot run with an error line, not a crash."""

from __future__ import annotations

import io

from benchmarks.harness.peer_remote import serve_commands


def test_wrong_commands_are_answered_with_errors_and_quit_ends_the_loop() -> None:
    answers = io.StringIO()
    serve_commands(io.StringIO("bogus\nstep never-initialized\ninit key notanumber 0\n\nquit\nbogus\n"), answers)
    lines = answers.getvalue().splitlines()
    assert len(lines) == 3  # nothing after quit; the empty line is skipped
    assert lines[0].startswith("error ValueError: unknown command 'bogus'")
    assert lines[1].startswith("error KeyError")
    assert lines[2].startswith("error ValueError")

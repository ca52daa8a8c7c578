"""What the ``r1`` commands share (``flows/cli.py``, ``flows/cli_eval.py``): one-line errors, the checks of
config, store and run names, the Prefect API the flows report to, the run's lease and Ctrl-C handling."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, NoReturn, Optional

import typer
from flows.cli_errors import RESUME, failure_line, quiet_tracebacks, store_silent
from flows.prefect_api import PrefectAPIUnreachable, cancel_flow_runs, prefect_api
from tasks.config.pipeline import ConfigError, PipelineConfig, check_run_name, check_store_url, load_config
from tasks.config.stages import UnknownStage, get_stage
from tasks.storage.lease import RunLease, acquire_lease
from tasks.storage.store import Store, StoreError

# Before Prefect is imported: no analytics (machines without internet) and a generous temporary-server
# start-up on busy laptops. Users' own settings win.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message.strip().splitlines()[0] if message.strip() else 'failed'}", err=True)
    raise typer.Exit(1)


def _config(path: Optional[Path]) -> Any:
    try:
        return load_config(path)
    except ConfigError as e:
        _fail(str(e))


def _store(url: Optional[str]) -> Any:
    url = url or os.environ.get("R1_STORE") or None
    try:
        if url is not None:
            check_store_url(url)  # before Store() touches anything
        return Store(url)
    except (ConfigError, StoreError) as e:
        _fail(str(e))


@contextmanager
def _prefect_api() -> Iterator[None]:
    """Flows inside report to ``PREFECT_API_URL``'s server once it answers (else one line naming it), or to a
    temporary server of our own that a Ctrl-C does not kill before ``r1`` can record the interruption."""

    try:
        with prefect_api(on_dead=_stop_run_server_gone):
            yield
    except PrefectAPIUnreachable as e:
        _fail(str(e))


def _run_name(name: str) -> str:
    try:
        return check_run_name(name)
    except ConfigError as e:
        _fail(str(e))


def _run_seeds(st: Any, run_name: str, strict: bool = True) -> dict[str, int] | None:
    """Every seed field of the config run ``run_name`` was started with (``PipelineConfig.seeds``); None when the
    store holds no config for it (or, not ``strict``, one this code cannot read; strict: fail naming the file)."""
    # heavy import (prefect): the CLI starts without it
    from flows.stages import RUN_CONFIG

    saved = st.read_run_file(run_name, RUN_CONFIG)
    if saved is None:
        return None
    try:
        return PipelineConfig.model_validate(saved["config"]).seeds()
    except Exception as e:  # noqa: BLE001 - a config this code cannot read: name the file and stop
        if not strict:
            return None
        _fail(f"{st.uri(st.run_file(run_name, RUN_CONFIG))}: the run's saved config does not load: {e}")


def _recorded_config(st: Any, run_name: str) -> Any:
    """The config run ``run_name`` recorded (what ``r1 stage`` without -c runs), None for a run the store does not
    hold yet; a saved config this code cannot read fails, naming the file."""
    # heavy import (prefect): the CLI starts without it
    from flows.stages import RUN_CONFIG

    saved = st.read_run_file(run_name, RUN_CONFIG)
    if saved is None:
        return None
    try:
        return PipelineConfig.model_validate(saved["config"])
    except Exception as e:  # noqa: BLE001 - a config this code cannot read: name the file and stop
        _fail(f"{st.uri(st.run_file(run_name, RUN_CONFIG))}: the run's saved config does not load (pass the config "
              f"to run with, -c FILE): {e}")


def _check_run_seed(st: Any, run_name: str, seed: int) -> None:
    """Refuse ``--seed`` on a run whose saved config has another seed: its committed outputs were made with it."""
    other = {k: v for k, v in (_run_seeds(st, run_name) or {}).items() if v != seed}
    if other:
        shown = ", ".join(f"{k}={v}" for k, v in other.items())
        _fail(f"run {run_name!r} in {st.url} was started with {shown}, not --seed {seed}; drop --seed to use the "
              f"run's own seeds, or start a new run: r1 run --seed {seed} --run NEW-NAME")


def _existing_run(st: Any, name: str) -> None:
    """Fail unless the store holds run ``name``; the message lists a few runs it does hold."""
    runs = st.runs()
    if name in runs:
        return
    shown = ", ".join(runs[-5:]) + (f" (and {len(runs) - 5} more)" if len(runs) > 5 else "")
    _fail(f"no run {name!r} in store {st.url}; " + (f"runs there: {shown}" if runs else "it holds no runs yet")
          + "; pass --store if the run is in another store")


_STOPPED: list[tuple[str, str]] = []  # (cause, why) this command stopped itself, for ``_interruptible``'s one line
LEASE_LOST, STORE_SILENT, SERVER_GONE, SIGTERM = "lease", "store", "server", "sigterm"


def _stop_run(cause: str, reason: str) -> None:
    """Stop this command as Ctrl-C does (training process group down, flow runs Cancelled); ``_interruptible``
    then prints ``reason``. Called from the lease's or the server watch's thread: the SIGINT reaches the main
    thread wherever it waits."""
    _STOPPED.append((cause, reason))
    os.kill(os.getpid(), signal.SIGINT)


def _stop_writer(reason: str) -> None:
    """The lease's ``on_lost``: a writer that lost its run commits nothing more."""
    _stop_run(LEASE_LOST, reason)


def _stop_run_server_gone(reason: str) -> None:
    """The Prefect server watch's ``on_dead``: nothing the run does can be recorded any more; stop within seconds
    (``flows/prefect_watch.py`` has made Prefect's calls fail at once instead of retrying for minutes)."""
    _stop_run(SERVER_GONE, reason)


def _server_gone() -> bool:
    return any(cause == SERVER_GONE for cause, _ in _STOPPED)


def _refuse_held_lease(st: Any, run_name: str, force: bool) -> None:
    """Fail at once, naming the holder, when another live writer holds the run: before the Prefect API starts
    (a temporary server takes seconds), so a refused start says so in about a second. ``_lease`` checks again."""

    try:
        RunLease(st, run_name).refuse_if_held(force=force)
    except StoreError as e:
        _fail(str(e))


def _lease(st: Any, run_name: str, force: bool) -> Any:
    """The run's lease (one writer per run), taken before any stage starts; enter it to keep it alive. Losing
    it stops the command (``_stop_writer``); lost because no heartbeat reached the store in time (its ``valid_until``
    passed), it is the store that went silent, and the line says so (``store_silent``): fix it and rerun."""
    taken: list[Any] = []

    def on_lost(reason: str) -> None:
        if taken and time.time() > getattr(taken[0], "valid_until", float("inf")):
            _stop_run(STORE_SILENT, store_silent(st, reason))
        else:
            _stop_writer(reason)

    try:
        taken.append(acquire_lease(st, run_name, force=force, on_lost=on_lost))
    except StoreError as e:  # LeaseHeld names the holder and how to proceed
        _fail(str(e))
    return taken[0]


INTERRUPTED = 130  # the shell's code for a command ended by SIGINT
TERMINATED = 143  # ... and by SIGTERM


def _terminate_as_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM unwinds as Ctrl-C does (the lease released, flow runs Cancelled), once."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _STOPPED.append((SIGTERM, "terminated (SIGTERM)"))
    raise KeyboardInterrupt


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while flows ran, after their runs were marked Cancelled; the message says so."""


@contextmanager
def _interruptible() -> Iterator[None]:
    """Outermost around a command's flows: Ctrl-C (or SIGTERM) ends the command with one line and exit code 130
    (143), once the contexts inside have unwound (lease released, temporary server stopped); a lost lease or a
    Prefect server gone (``_stop_run``) with one ``error:`` line and exit code 1."""
    _STOPPED.clear()
    main = threading.current_thread() is threading.main_thread()  # signal handlers can only be set there
    previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt) if main else None
    ignored = main and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:  # started with SIGINT ignored (`r1 run &` in a script): Ctrl-C stays ignored, the run's own stops work
        signal.signal(signal.SIGINT, _own_stops_only)
    try:
        yield
    except KeyboardInterrupt as e:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        said = str(e) if isinstance(e, Interrupted) else "interrupted before any stage started"
        cause, reason = _STOPPED[0] if _STOPPED else ("", "")
        if cause == LEASE_LOST:
            _fail(f"{reason}; this writer stopped and commits nothing more to the run")
        if cause == STORE_SILENT:
            _fail(reason)
        if cause == SERVER_GONE:
            _fail(f"{reason}; the run stopped (nothing more could be recorded): {RESUME}")
        if _STOPPED:
            typer.echo(f"{reason}: {said}", err=True)
            raise typer.Exit(TERMINATED) from None
        typer.echo(said, err=True)
        raise typer.Exit(INTERRUPTED) from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _own_stops_only(signum: int, frame: Any) -> None:
    """SIGINT handler of a command started with SIGINT ignored: only ``_stop_run``'s own signal interrupts it."""
    if _STOPPED:
        raise KeyboardInterrupt


FORCE_UNLOCK = "take the run's lease even if another writer holds it (only when that writer is gone)"
STORE_HELP = "store root: a folder or s3://bucket/prefix (default: $R1_STORE, else ./r1-runs)"
RUN_NAME_HELP = "the run's name (as given to r1 run --run, or the timestamped one r1 run printed)"


def _run_flow(fn: Any, **params: Any) -> Any:
    """Call a flow; a failure becomes one error line (``failure_line``; Prefect's console shows each failure's
    first line, its traceback only with ``R1_TRACEBACK=1``: ``flows/cli_errors.py``).

    Ctrl-C: the task in progress takes its training process group down (``tasks/runner/launch.py``), Prefect records the
    runs as Crashed, and we mark this call's flow runs Cancelled (found by a tag given to them here) and exit 130.
    The next ``r1 run``/``r1 stage`` with the same run resumes from the last stored checkpoint."""
    import prefect

    tag = f"r1-call-{uuid.uuid4().hex[:12]}"
    quiet_tracebacks()  # Prefect's console: a failure's first line, not its traceback at every level
    try:
        with prefect.tags(tag):
            state = fn(**params, return_state=True)
    except BaseException as e:
        if not (isinstance(e, KeyboardInterrupt) or _server_gone()):
            raise  # with the server gone, the engines' calls to it fail as the interrupt unwinds: still ours
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        if _server_gone():
            raise Interrupted("stopped: the Prefect server is gone") from None

        cancelled = cancel_flow_runs(tag)
        raise Interrupted(f"interrupted: {cancelled} flow run(s) marked Cancelled; rerun the same command to resume "
                          "from the last checkpoint") from None
    if _server_gone():  # the flow ended on a failed call to the server before the interrupt arrived
        raise Interrupted("stopped: the Prefect server is gone")
    if state.is_completed():
        return state.result()
    exc = state.result(raise_on_failure=False)
    _fail(failure_line(exc) if isinstance(exc, BaseException) else str(state.message))


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _stage_entry(name: str) -> Any:
    try:
        return get_stage(name)
    except UnknownStage as e:
        _fail(str(e))

"""``TrackerCallback``: one expr_tracker run per Hydra job, opted into with ``hydra.callbacks``.

.. code-block:: yaml

    hydra:
      callbacks:
        tracker:
          _target_: expr_tracker.hydra.TrackerCallback
          project: digits          # any et.init() keyword argument

An app using the callback does not call ``et.init`` itself: at job start the callback calls
``et.init(spec=cfg.tracker, config=<the app config>, ...)``; the task function logs with
``et.log`` as usual; at job end the callback finishes the run — also when the task raised
(the open row is committed, the run is marked ``failed`` and the exception recorded in
``run.json``; Hydra then reports the error as usual).

Naming (a spec's own ``name``/``group`` wins where noted):

- single run: ``name`` from the spec, else the default (a timestamp and a random suffix);
  ``group`` from the spec.
- multirun: one run per job named ``<prefix>-<hydra.job.num>[-<hydra.job.override_dirname>]``
  where ``<prefix>`` is the spec's ``name`` or else the sweep's stamp: the last two parts of
  ``hydra.sweep.dir`` (``2024-05-01_12-00-00`` by default), followed by the launch time
  unless the directory already names this launch's time (Hydra's default ``${now:...}``
  directories), then the launch id (``multirun_docs-20240501-120000-3fa9c1``). Launch time
  and id are taken once per sweep in ``on_multirun_start`` (the id reserved in the sweep
  directory as ``.et-launch-<id>`` with ``O_EXCL``) and travel with the callback (launchers
  pickle it into the job processes); without them, the time ``multirun.yaml`` was written
  into the sweep directory (its nanoseconds give the id), else the process start. So the
  names are stable within one sweep, and two sweeps — even into the same
  ``hydra.sweep.dir`` in the same second — never continue each other's runs. ``group`` is
  the spec's ``group`` or else ``<hydra.job.name>-<stamp>``: every job of one sweep shares it.
  A spec ``name`` is used as given (jobs of two sweeps with the same ``tracker.name`` share
  runs: that is asking for it).

``run.json`` gets a ``hydra`` record: the job's ``output_dir``, the ``.hydra/`` directory
holding Hydra's own ``config.yaml``, ``hydra.yaml`` and ``overrides.yaml`` (their location,
not copies), the job name, number, override list and, in a multirun, the sweep directory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger("expr_tracker")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.,=+\-@%]+")
_MAX_NAME = 200


def _safe(text: str) -> str:
    """``text`` usable inside one directory name: runs of other characters become ``_``."""
    return _UNSAFE.sub("_", text).strip("._") or "_"


def _bounded(name: str) -> str:
    if len(name.encode()) <= _MAX_NAME:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return name.encode()[: _MAX_NAME - 9].decode(errors="ignore") + "-" + digest


def sweep_stamp(sweep_dir: str) -> str:
    """``multirun/2024-05-01/12-00-00`` -> ``2024-05-01_12-00-00`` (the last two parts)."""
    parts = [p for p in Path(sweep_dir).parts if p not in ("", "/", ".")]
    return _safe("_".join(parts[-2:])) if parts else "sweep"


_PROCESS_START = time.time()  # the last fallback for a sweep's launch time
_LAUNCH_FMT = "%Y%m%d-%H%M%S"
#: Hydra's default sweep directory ``multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}`` as a stamp
_DIR_TIME_FMT = "%Y-%m-%d_%H-%M-%S"
_DIR_TIME_SLACK = 120.0  # seconds between composing the config and on_multirun_start


def launch_stamp(launched_at: float) -> str:
    """``1714564800.0`` -> ``20240501-120000`` (local time, to the second)."""
    return time.strftime(_LAUNCH_FMT, time.localtime(launched_at))


def sweep_prefix(sweep_dir: str, launched_at: float) -> str:
    """The run-name prefix of one sweep launch: :func:`sweep_stamp` of the directory, then
    ``-<launch stamp>`` unless the directory's stamp is itself a time within a couple of
    minutes of the launch (Hydra's default ``${now:...}`` sweep directory), which already
    tells this launch from any other."""
    stamp = sweep_stamp(sweep_dir)
    try:
        dir_time = datetime.strptime(stamp, _DIR_TIME_FMT).timestamp()
    except ValueError:
        dir_time = None
    if dir_time is not None and abs(dir_time - launched_at) <= _DIR_TIME_SLACK:
        return stamp
    return f"{stamp}-{launch_stamp(launched_at)}"


def _fallback_launch_time(sweep_dir: str) -> float:
    """When ``on_multirun_start`` did not run in this callback's lineage: the time Hydra's
    sweeper wrote ``<sweep dir>/multirun.yaml`` (once per launch, before any job), else the
    start of this process."""
    if sweep_dir:
        try:
            return os.stat(Path(sweep_dir) / "multirun.yaml").st_mtime
        except OSError:
            pass
    return _PROCESS_START


_LAUNCH_FILE = ".et-launch-"


def reserve_launch_id(sweep_dir: str) -> str:
    """A random 6-hex-digit id of one sweep launch, reserved in ``sweep_dir`` by creating
    ``<sweep_dir>/.et-launch-<id>`` with ``O_EXCL`` (a taken id is drawn again). Where the
    directory cannot be written the id is only random (48 bits)."""
    for _ in range(100):
        launch_id = secrets.token_hex(3)
        if not sweep_dir:
            return launch_id
        try:
            Path(sweep_dir).mkdir(parents=True, exist_ok=True)
            fd = os.open(
                Path(sweep_dir) / f"{_LAUNCH_FILE}{launch_id}",
                os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                0o644,
            )
        except FileExistsError:
            continue
        except OSError:
            return launch_id
        os.close(fd)
        return launch_id
    return secrets.token_hex(3)


def _fallback_launch_id(sweep_dir: str) -> str:
    """When ``on_multirun_start`` did not run in this callback's lineage: an id derived from
    the nanosecond time Hydra's sweeper wrote ``<sweep_dir>/multirun.yaml`` (once per
    launch, shared by its jobs), else from this process."""
    seed = f"{_PROCESS_START}-{os.getpid()}"
    if sweep_dir:
        try:
            seed = str(os.stat(Path(sweep_dir) / "multirun.yaml").st_mtime_ns)
        except OSError:
            pass
    return hashlib.sha1(seed.encode()).hexdigest()[:6]


def job_run_name(prefix: str, num: Any, override_dirname: str = "") -> str:
    """The run name of one multirun job: ``<prefix>-<num>[-<override_dirname>]``.

    Characters other than letters, digits and ``_ . , = + - @ %`` become ``_`` (so
    ``+tracker/alerts=nan_guard`` cannot create sub-directories); names longer than 200 bytes
    are cut and end with a hash of the full name. Returns a string valid as ``RunSpec.name``.
    """
    name = f"{_safe(str(prefix))}-{num}"
    if override_dirname:
        name += "-" + _safe(override_dirname)
    return _bounded(name)


def _mode(hydra_cfg: DictConfig) -> str | None:
    """``"RUN"``, ``"MULTIRUN"`` or None (``hydra.mode`` holds a ``RunMode`` enum)."""
    mode = OmegaConf.select(hydra_cfg, "mode", default=None)
    if mode is None:
        return None
    return str(getattr(mode, "name", mode)).rsplit(".", 1)[-1]


class TrackerCallback(Callback):
    """Starts an expr_tracker run at each Hydra job start and finishes it at job end.

    Args:
        spec_key: the app config key holding the run spec (default ``tracker``, what
            ``+tracker=default`` composes); a missing key means no spec (defaults and
            ``ET_CONFIG`` apply).
        config_exclude: top-level keys of the app config left out of the run's ``config``
            (default: the ``spec_key``; the spec itself is saved as ``spec.json``).
        **init_kwargs: passed to ``et.init`` (``project``, ``dir``, ``tags``, ...); they win
            over the spec, as keyword arguments always do.

    Raises (at job start, so the job fails before the task runs):
        SpecError: the composed spec is invalid; every problem names its config key
            (``tracker.history.buffer.size``).
    """

    def __init__(
        self,
        spec_key: str = "tracker",
        config_exclude: list[str] | None = None,
        **init_kwargs: Any,
    ) -> None:
        self.spec_key = spec_key
        self.config_exclude = (
            [spec_key] if config_exclude is None else [str(k) for k in config_exclude]
        )
        self.init_kwargs = {
            k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
            for k, v in init_kwargs.items()
        }
        self.run: Any = None
        #: epoch seconds of this sweep's launch (set in ``on_multirun_start``; pickled with
        #: the callback into job processes)
        self.launched_at: float | None = None
        #: this launch's random id (set in ``on_multirun_start``, pickled likewise)
        self.launch_id: str | None = None

    # ------------------------------------------------------------------ sweep start

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Take the sweep's launch time and launch id once: they make this sweep's run names
        unique.

        The launch time has one-second resolution, so two launches into the same sweep
        directory in one second (or into Hydra's default directory, named after that second)
        would share it; the launch id tells them apart: a random suffix reserved in the sweep
        directory with ``O_EXCL`` (``.et-launch-<id>``), so no two launches into one
        directory ever get the same one.
        """
        self.launched_at = time.time()
        sweep_dir = OmegaConf.select(config, "hydra.sweep.dir", default=None)
        self.launch_id = reserve_launch_id(str(sweep_dir) if sweep_dir else "")

    # ------------------------------------------------------------------ job start

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Start the run of this job (``config`` is the job's config, ``hydra`` key included)."""
        import expr_tracker as et

        hydra_cfg = config.get("hydra")
        spec = OmegaConf.select(config, self.spec_key) if self.spec_key else None
        given = dict(self.init_kwargs)
        given.setdefault("config", self._app_config(config))
        if hydra_cfg is not None:
            self._name_and_group(hydra_cfg, spec, given)
        self.run = et.init(spec=spec, **given)
        if hydra_cfg is not None:
            self._record_hydra(hydra_cfg)

    def _app_config(self, config: DictConfig) -> dict[str, Any]:
        app = OmegaConf.masked_copy(
            config, [k for k in config.keys() if k != "hydra" and k not in self.config_exclude]
        )
        with open_dict(app):
            return OmegaConf.to_container(app, resolve=True)

    def _name_and_group(self, hydra_cfg: DictConfig, spec: Any, given: dict[str, Any]) -> None:
        if _mode(hydra_cfg) != "MULTIRUN":
            return
        spec_name = OmegaConf.select(spec, "name", default=None) if spec is not None else None
        spec_group = OmegaConf.select(spec, "group", default=None) if spec is not None else None
        sweep_dir = str(OmegaConf.select(hydra_cfg, "sweep.dir", default="") or "")
        if self.launched_at is None:
            self.launched_at = _fallback_launch_time(sweep_dir)
        if self.launch_id is None:
            self.launch_id = _fallback_launch_id(sweep_dir)
        stamp = f"{sweep_prefix(sweep_dir, self.launched_at)}-{self.launch_id}"
        job = hydra_cfg.job
        num = OmegaConf.select(job, "num", default=0)
        dirname = str(OmegaConf.select(job, "override_dirname", default="") or "")
        if "name" not in given:
            given["name"] = job_run_name(spec_name or stamp, num, dirname)
        if "group" not in given:
            given["group"] = spec_group or f"{_safe(str(job.name))}-{stamp}"

    def _record_hydra(self, hydra_cfg: DictConfig) -> None:
        from expr_tracker.history.runinfo import write_run_info

        output_dir = OmegaConf.select(hydra_cfg, "runtime.output_dir", default=None)
        subdir = OmegaConf.select(hydra_cfg, "output_subdir", default=None)
        record: dict[str, Any] = {
            "output_dir": output_dir,
            "config_dir": (
                str(Path(output_dir) / subdir) if output_dir and subdir is not None else None
            ),
            "job_name": OmegaConf.select(hydra_cfg, "job.name", default=None),
            "job_num": OmegaConf.select(hydra_cfg, "job.num", default=None),
            "overrides": list(OmegaConf.select(hydra_cfg, "overrides.task", default=[]) or []),
            "mode": _mode(hydra_cfg),
        }
        if record["mode"] == "MULTIRUN":
            sweep = OmegaConf.select(hydra_cfg, "sweep.dir", default=None)
            record["sweep_dir"] = os.path.abspath(sweep) if sweep else None
        run = self.run
        run.info_record["hydra"] = record
        try:
            write_run_info(run._info_path, run.info_record)
        except OSError as exc:  # measuring never breaks the job
            log.warning("expr_tracker: cannot record the Hydra job in run.json (%s)", exc)

    # ------------------------------------------------------------------ job end

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        """Finish the run: commit the open row; a failed job marks it ``failed`` with the
        exception the task raised."""
        from hydra.core.utils import JobStatus

        import expr_tracker as et

        run, self.run = self.run, None
        if run is None:
            return
        error = None
        if getattr(job_return, "status", None) == JobStatus.FAILED:
            value = getattr(job_return, "_return_value", None)
            error = value if isinstance(value, BaseException) else RuntimeError(str(value))
        try:
            run.finish(exception=error)
        finally:
            if et.get_run() is run:
                et.finish()  # drops the finished run from the module-level singleton

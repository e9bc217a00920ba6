"""The site worker: claims tasks from the campaign service and runs them as MPI jobs through Parsl.

Layers, as Parsl has them: the *provider* (where blocks of nodes come from:
``LocalProvider``, ``SlurmProvider``, ``PBSProProvider``), the *launcher* (how
ranks start: ``mpiexec`` or ``srun`` through ``$PARSL_MPI_PREFIX``), the
*executor* (``MPIExecutor``: how tasks are placed on a block's nodes). A site
file (``deploy/sites/*.toml``, :mod:`worker.site`) chooses them;
:func:`worker.parsl_config.build_parsl_config` turns it into a Parsl ``Config``.

Modules:

* :mod:`worker.settings` -- the worker's settings (``MAPCAMPAIGN_*`` variables);
* :mod:`worker.site` -- site files, validated; :mod:`worker.layout` -- the site data folder;
* :mod:`worker.parsl_config` -- site -> Parsl ``Config`` (one pure function);
* :mod:`worker.commands` -- pure builders of the runner's command line and resource specifications
  (the map-maker's own command line, exit codes and file names are :mod:`schemas.programs`);
* :mod:`worker.runner` -- the program every task runs under: deadline, cancel file,
  dead-man switch, kills the whole task, writes ``status.json``;
* :mod:`worker.outcome` -- how a task ended, one enum, mapped onto the service's failure classes;
* :mod:`worker.scheduler` -- why the batch scheduler ended a block;
* :mod:`worker.client` -- the service's worker protocol over HTTP;
* :mod:`worker.stages` -- the stages of one task: :mod:`~worker.stages.prepare`,
  :mod:`~worker.stages.run`, :mod:`~worker.stages.report`;
* :mod:`worker.tasks` -- one claimed task through those stages, as the loop holds it;
* :mod:`worker.agent` -- the loop: register, claim, heartbeat, drain on SIGTERM, one module per job;
* :mod:`worker.clock` -- the clock the agent and its tasks read and wait on (a test moves its own).

The worker holds no state the service does not also hold: a restarted worker
starts from nothing, and tasks it lost come back through lease expiry.
"""

"""Inspection from the terminal: ``gym-sidecar rollouts``, ``trace`` and ``stats``.

:mod:`.render` turns what :mod:`gym_sidecar.store.queries` / :mod:`~gym_sidecar.store.stats`
read into ``rich`` tables; :mod:`.commands` adds the subcommands to the CLI.
"""

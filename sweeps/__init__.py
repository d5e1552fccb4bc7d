"""Sweep orchestration: grids of configs over decoded traces, executors (processes, Ray), a resumable
keyed results store, ranking, and hit-rate curves. Downstream of the replay engine (simulator/)."""

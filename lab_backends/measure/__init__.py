"""The measure layer: load generation, statistics, traces, metrics, sweeps, benchmarks and plots.

Contract: turns a running server's own records (statistics API, trace files, Prometheus metrics)
into tidy pandas frames and figures; generates bounded load to produce them. Never asserts a lesson
(that is the lessons layer) and never starts a server except through :class:`TritonServer`. May
import the client and server layers and the shared basics.
"""

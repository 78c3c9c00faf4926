"""The sidecar-injection mutating admission webhook (``gym-sidecar webhook``).

Modules: ``config`` (what is injected, how it serves), ``admission`` (AdmissionReview v1
types), ``mutate`` (the pure pod -> pod injection and the opt-in rule), ``review`` (one
review in, one answer out, failing open), ``server`` (HTTPS, certificate reload,
counters), ``cli`` (the subcommand).
"""

"""``commdiag ab``: a certified A/B of the user's own end-to-end benchmark.

spec (the YAML spec and the one-line form), presets (reading a benchmark's numbers), server (one
server per launch: start, readiness, stop), runner (the run folder and its launches), verdict (the
paired within-round statistics), machine (confounders per arm), render (text and JSON), report
(report.html).
"""

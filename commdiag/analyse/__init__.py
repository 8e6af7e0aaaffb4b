"""From stored results to answers: screening, certification, verdicts, reports, compare."""

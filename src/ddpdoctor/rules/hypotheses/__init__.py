"""Causes that no single line proves, inferred from how the ranks behaved. One module each:
its documentation (a Rule without signatures, so `explain` covers it) beside the function that
scores it from the job's evidence. The engine in analysis/ runs them all the same way."""

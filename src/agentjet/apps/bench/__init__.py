"""Version-by-version performance tracking (`ajet bench`): the suite that measures, and the history, baseline, gate and report."""

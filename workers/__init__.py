"""memflow's processes: one thin module per stage, the query worker and the command line."""

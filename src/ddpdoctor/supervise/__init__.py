"""`ddpdoctor run`: supervise a live job (child process tree, output capture, hang watchdog,
stack collection). Produces a run folder that `ddpdoctor diagnose` reads; never prints.
"""

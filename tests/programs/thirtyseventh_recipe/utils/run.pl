#!/usr/bin/env bash
# A bash stand-in for Kaldi's utils/run.pl (one job, no JOB=1:N arrays):
#   run.pl LOG CMD [ARGS...]
# writes the command line as a "# ..." header into LOG, appends everything the command prints,
# and ends LOG with run.pl's accounting lines; on failure it says where the log is and exits 1.
if [ $# -lt 2 ]; then
    echo "Usage: run.pl <log-file> <command>" >&2
    exit 1
fi
logfile=$1
shift
mkdir -p "$(dirname "${logfile}")"
start=$(date +%s)
{
    echo "# $*"
    echo "# Started at $(date)"
    echo "#"
} > "${logfile}"
"$@" >> "${logfile}" 2>&1
ret=$?
end=$(date +%s)
{
    echo "# Accounting: time=$((end - start)) threads=1"
    echo "# Ended (code ${ret}) at $(date), elapsed time $((end - start)) seconds"
} >> "${logfile}"
if [ ${ret} -ne 0 ]; then
    echo "run.pl: job failed, log is in ${logfile}" >&2
    exit 1
fi
exit 0

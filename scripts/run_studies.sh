#!/usr/bin/env bash
# Issue 25's seeded studies on the offline stand-in (all-MiniLM-L6-v2 in fairseq RoBERTa format, not
# RoBERTa), one after the other: study b (standin-dpt-glue, 45 runs), study a (standin-inducer-nlu,
# 54 runs), then item 3's diagnoses (standin-sidpg-diagnosis, 33 runs; standin-inducer-diagnosis, 45 runs;
# standin-dpt-diagnosis, 15 runs),
# one CPU run at a time, each run's record written to
# docs/results/<name>/records (commit them with scripts/commit_records.sh). Resumable: run it again
# on the same checkout and it skips finished runs and resumes the interrupted one
# (examples/study/README.md). Extra arguments go to both sweeps (e.g. --dry-run, --seeds 1).
#
#   nohup setsid nice -n 19 scripts/run_studies.sh > sweeps/run_studies.log 2>&1 &
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's fairseq_idpg, not an installed one
for name in standin-dpt-glue standin-inducer-nlu standin-sidpg-diagnosis standin-inducer-diagnosis standin-dpt-diagnosis; do
    # one run, one thread: the runs' measured costs are one thread's, and a 2-thread run on a shared
    # 2-core CPU slows down badly when one of its threads is descheduled (docs/sweeps.md, Executors)
    scripts/sweep.sh "examples/study/$name.yaml" --jobs 1 --threads 1 --records "docs/results/$name/records" "$@"
    rc=$?
    echo "run_studies.sh: $name exited $rc at $(date -u +%FT%TZ)"
    [ "$rc" -eq 130 ] && exit 130  # interrupted (Ctrl-C, SIGTERM): do not start the next study
done

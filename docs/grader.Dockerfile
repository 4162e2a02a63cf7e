# The grader in a container: the course package, PyTorch and bubblewrap, nothing else (no solutions/, no exercises/).
# Written for docs/instructors.md; not built or run on the development machine (it has no Docker).
#
#   docker build -f docs/grader.Dockerfile -t modern-block-grader .
#   docker run --rm --network none --read-only --tmpfs /tmp:size=4g \
#       --memory 8g --cpus 2 --pids-limit 4096 \
#       --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#       --security-opt systempaths=unconfined \
#       -v "$PWD/submissions:/submissions:ro" -v "$PWD/exercises:/reference:ro" -v "$PWD/grades:/grades" \
#       modern-block-grader /submissions --reference /reference --jobs 2 --no-cgroup-i-accept-per-process-limits \
#       --csv /grades/gradebook.csv --json-file /grades/report.json
#
# The three security options let bubblewrap make its namespaces inside the container (Docker's default seccomp
# profile refuses new user namespaces, its AppArmor profile refuses mounts, and its masked /proc paths stop a new
# /proc from being mounted); each submission is then sandboxed by bubblewrap, and the container bounds the whole
# run. Docker's /sys/fs/cgroup is read-only, so no cgroup per submission can be made inside it: the grader refuses
# unless told --no-cgroup-i-accept-per-process-limits, and then limits every process of a submission and relies
# on the pid namespace, the container's --memory and --pids-limit bounding all of them together.
# The grader starts as root in the container and runs every submission as the system user modern-block-sandbox
# (made below; never uid 0), under its own seccomp filter (libseccomp through pyseccomp). docs/sandbox.md says
# what the sandbox promises and where it stops.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 MPLBACKEND=Agg MPLCONFIGDIR=/tmp/matplotlib

RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends bubblewrap \
    libseccomp2 && rm -rf /var/lib/apt/lists/* && useradd --system --no-create-home modern-block-sandbox

# CPU PyTorch first (the CPU wheel index keeps the image small), then the course package with its classroom
# extra (the seccomp binding, ICU for students' names), installed as a package (not editable) so that no checkout, and no solution notebook, is in the image; the sandboxes see
# /usr (the interpreter is /usr/local) with the installed package itself hidden
RUN pip install torch --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md /tmp/course/
COPY modern_block /tmp/course/modern_block
RUN pip install "/tmp/course[classroom]" && rm -rf /tmp/course

WORKDIR /grades
ENTRYPOINT ["python", "-m", "modern_block", "grade"]
CMD ["--help"]

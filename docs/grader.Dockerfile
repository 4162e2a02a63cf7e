# The grader in a container: the course package and PyTorch, nothing else (no solutions/, no exercises/).
# Written for docs/instructors.md; not built or run on the development machine (it has no Docker).
#
#   docker build -f docs/grader.Dockerfile -t modern-block-grader .
#   docker run --rm --network none --read-only --tmpfs /tmp:size=4g \
#       --memory 8g --cpus 2 --pids-limit 4096 \
#       --cap-drop ALL --cap-add CHOWN --cap-add DAC_OVERRIDE --cap-add FOWNER \
#       --cap-add KILL --cap-add SETUID --cap-add SETGID \
#       -v "$PWD/submissions:/submissions:ro" -v "$PWD/exercises:/reference:ro" -v "$PWD/grades:/grades" \
#       modern-block-grader /submissions --reference /reference --jobs 2 --csv /grades/gradebook.csv --json \
#       > grades/report.json
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 MPLBACKEND=Agg MPLCONFIGDIR=/tmp/matplotlib

# CPU PyTorch first (the CPU wheel index keeps the image small), then the course package, installed as a
# package (not editable) so that no checkout, and no solution notebook, is in the image
RUN pip install torch --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md /tmp/course/
COPY modern_block /tmp/course/modern_block
RUN pip install /tmp/course && rm -rf /tmp/course

# The grader runs as the container's root, which it needs to run every submission as a user of its own
# (a uid above 2,000,000,000): no submission can signal the grader or another submission, or write into the
# mounted folders. Python lives under /usr/local, readable by those users.
WORKDIR /grades
ENTRYPOINT ["python", "-m", "modern_block.grade"]
CMD ["--help"]

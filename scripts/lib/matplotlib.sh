# Sourced by the scripts that draw plots: sets $py to a python3 that has matplotlib
# (python3-matplotlib from scripts/setup.sh, i.e. the system python, which a pyenv or venv
# python3 earlier on PATH may not see), or to nothing.
py=
for cand in python3 /usr/bin/python3; do
    if "$cand" -c 'import matplotlib' 2>/dev/null; then
        py=$cand
        break
    fi
done

# sweep-args.sh -- sourced by allreduce-model.sh and compressed-allreduce.sh:
# the command line they share, and its defaults (bytes 16M, ranks "2 4 8",
# provider tcp). The script sets `here` (its directory), sources this, sets
# its own defaults (codecs; repeats, and take_repeats=1, if it takes
# --repeats) and help_lines (the sed range of its header comment that
# --help prints), then calls sweep_args "$@". That sets net ("" or --net's
# RATE) and bench (the terse-bench to run: the argument, else the build
# tree's), or exits: 0 after --help, 2 on a usage error or without
# terse-bench.
bytes=16M
ranks="2 4 8"
provider=tcp

sweep_usage_error() {
    echo "${0##*/}: $* (try --help)" >&2
    exit 2
}

sweep_args() {
    bench=""
    net=""
    while [[ $# -gt 0 ]]; do
        case $1 in
        -h | --help)
            sed -n "${help_lines}p" "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        --net) net=$2; shift 2 ;;
        --bytes) bytes=$2; shift 2 ;;
        --ranks) ranks=$2; shift 2 ;;
        --codecs) codecs=$2; shift 2 ;;
        --provider) provider=$2; shift 2 ;;
        --repeats)
            [[ ${take_repeats:-} == 1 ]] || sweep_usage_error "unknown option $1"
            repeats=$2; shift 2 ;;
        -*) sweep_usage_error "unknown option $1" ;;
        *) bench=$1; shift ;;
        esac
    done
    bench=${bench:-$here/../../build/bench/terse-bench}
    [[ -x $bench ]] || { echo "${0##*/}: no terse-bench at $bench (build first)" >&2; exit 2; }
}

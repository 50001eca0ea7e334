# rate-bytes.sh -- sourced by core/slow-net.sh and ps/ps-netns.sh, which
# shape links with tc-tbf(8) and size its burst from the rate.
#
# rate_bytes RATE: RATE as tc(8) reads rates, in bytes per second, on
# stdout; status 1 if it is not one. tc's units: bit, kbit, mbit, gbit,
# tbit are bits (decimal multiples); bps, kbps, mbps, gbps, tbps are bytes;
# a bare number is bytes per second as tc reads it.
rate_bytes() {
    local r=${1,,} num unit mult
    [[ $r =~ ^([0-9]+(\.[0-9]+)?)([a-z]*)$ ]] || return 1
    num=${BASH_REMATCH[1]}
    unit=${BASH_REMATCH[3]}
    case $unit in
        bit) mult=0.125 ;; kbit) mult=125 ;; mbit) mult=125000 ;;
        gbit) mult=125000000 ;; tbit) mult=125000000000 ;;
        "" | bps) mult=1 ;; kbps) mult=1000 ;; mbps) mult=1000000 ;;
        gbps) mult=1000000000 ;; tbps) mult=1000000000000 ;;
        *) return 1 ;;
    esac
    awk -v n="$num" -v m="$mult" 'BEGIN { printf "%.0f\n", n * m }'
}

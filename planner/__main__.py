import sys

try:
    from .entry import main
except KeyboardInterrupt:  # Ctrl-C before the entry point could set its handlers: the same one line
    sys.stderr.write("error: interrupted\n")
    raise SystemExit(130) from None

main()

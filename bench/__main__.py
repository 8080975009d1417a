import sys

if __name__ == "__main__":
    if "--soak" in sys.argv[1:]:  # the lifecycle soak: bench/soak.py
        from bench.soak import main
    else:
        from bench.cli import main
    sys.exit(main())

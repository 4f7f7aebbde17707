from labfleet.cli import main

main()

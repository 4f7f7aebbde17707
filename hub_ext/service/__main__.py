from labfleet.service.app import main

main()

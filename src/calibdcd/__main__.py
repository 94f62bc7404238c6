from calibdcd.cli import main

main()

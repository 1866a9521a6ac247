from chalie.cli import main

main()

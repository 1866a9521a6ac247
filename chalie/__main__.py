from chalie_app.cli import main

main()

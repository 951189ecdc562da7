from gcis_etl.cli import main

main()

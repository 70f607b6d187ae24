build/src/dayzero/cli/dayzero bench limits --json --threads 2 --seconds 0.2

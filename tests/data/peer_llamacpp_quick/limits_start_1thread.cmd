build/src/dayzero/cli/dayzero bench limits --json --threads 1 --seconds 0.2

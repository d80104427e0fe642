from durable_agent.cli.commands import main

main()

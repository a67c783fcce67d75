from agentjet.cli import main

main()

"""The CLI's commands, one module each: its subparser (`add_parser`) and its handler (`cmd_NAME`)."""

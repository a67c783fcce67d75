"""``python -m agentjet.settings``: the table of every server setting (flag, environment variable, bounds,
default, description) as Markdown, as in docs/configuration.md."""

from agentjet.settings.fields import server_fields


def table() -> str:
    rows = ["| setting | flag | environment | bounds / choices | default | live | description |",
            "|---|---|---|---|---|---|---|"]
    for f in server_fields():
        flags = " ".join(f"`--{n}`" for n in (f.flag, *f.aliases))
        if f.is_bool:
            flags += f" / `--no-{f.flag}`"
        default = "" if f.is_secret else f.default_text()
        bounds = f.bounds_text().replace("|", " \\| ")
        rows.append(f"| `{f.dotted}` | {flags} | `{f.env}` | {bounds} | {default} | "
                    f"{'yes' if f.live else ''} | {f.info.description or ''} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())

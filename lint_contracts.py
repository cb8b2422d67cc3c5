"""import-linter contract types of the house's own (pyproject.toml's `contract_types`): an allow-list.

import-linter's `forbidden` contract is a deny-list: a module it does not name is allowed, so a room added later is
silently open to the job. `allowed` names what its sources may import within the root package, and nothing else:
`lint-imports` (run from the repository root, which it puts on sys.path) loads this module.
"""

from __future__ import annotations

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output


class AllowedContract(Contract):
    """The source modules (and everything below them) import, of the root package, only themselves, the allowed
    modules (and everything below those) and the root package itself (its __init__).

    Options: source_modules, allowed_modules (lists of modules).
    """

    type_name = "allowed"

    source_modules = fields.ListField(subfield=fields.ModuleField())
    allowed_modules = fields.ListField(subfield=fields.ModuleField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        sources = [m.name for m in self.source_modules]
        allowed = [m.name for m in self.allowed_modules]
        roots = {name.split(".")[0] for name in sources}

        def within(module: str, packages: list[str]) -> bool:
            return any(module == p or module.startswith(p + ".") for p in packages)

        broken = []
        for source in sources:
            for importer in sorted({source} | graph.find_descendants(source)):
                for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                    if imported in roots or within(imported, sources) or within(imported, allowed):
                        continue
                    lines = graph.get_import_details(importer=importer, imported=imported)
                    line = lines[0]["line_number"] if lines else "?"
                    broken.append(f"{importer} -> {imported} (l.{line})")
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        output.print_error("Imports outside the allow-list:")
        for line in check.metadata["broken"]:
            output.print_error(f"- {line}")
            output.new_line()

"""A repair of fairseq: the symbols it replaces, the version it was written against, and how
it is installed and undone."""

import importlib
import logging
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

# The fairseq the repairs were written and tested against (the PyPI sdist fairseq-fixed).
FAIRSEQ_VERSION = "0.12.3.1"


@dataclass(frozen=True)
class Replacement:
    """One attribute a repair replaces.

    Attributes:
        owner: the dotted name of the module, or of the class, that holds it, e.g.
            "fairseq.checkpoint_utils" or "fairseq.data.FairseqDataset".
        attribute: its name there.
        make: a function from the original value to its replacement.
    """

    owner: str
    attribute: str
    make: object

    @property
    def symbol(self):
        return f"{self.owner}.{self.attribute}"


def _resolve(dotted):
    """The module or class a dotted name names (a module, or a class in a module)."""
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError:
        module, _, name = dotted.rpartition(".")
        return getattr(importlib.import_module(module), name)


@dataclass
class Repair:
    """A repair of fairseq, installed at most once and undone exactly.

    Attributes:
        name: what it repairs, for messages.
        replacements: the attributes it replaces.
        on_install, on_uninstall: what else it does and undoes (optional functions).
    """

    name: str
    replacements: tuple
    on_install: object = None
    on_uninstall: object = None
    _originals: list = field(default_factory=list, repr=False)

    @property
    def replaces(self):
        """The dotted names of the fairseq symbols it replaces."""
        return [replacement.symbol for replacement in self.replacements]

    @property
    def installed(self):
        return bool(self._originals)

    def install(self):
        """Replace the symbols (a no-op when installed already).

        A fairseq other than FAIRSEQ_VERSION is logged as a warning that names the symbols
        replaced; a symbol that is missing stops the install before anything is replaced.

        Raises:
            RuntimeError: a symbol to replace does not exist in this fairseq.
        """
        if self.installed:
            return
        import fairseq

        version = getattr(fairseq, "__version__", "unknown")
        if version != FAIRSEQ_VERSION:
            logger.warning(
                "fairseq-entmax's repair '%s' was written against fairseq %s (fairseq-fixed) and this is fairseq %s: "
                "it replaces %s; check that they still do what the repair expects.",
                self.name,
                FAIRSEQ_VERSION,
                version,
                ", ".join(self.replaces),
            )
        owners = []
        for replacement in self.replacements:
            owner = _resolve(replacement.owner)
            if not hasattr(owner, replacement.attribute):
                raise RuntimeError(
                    f"fairseq-entmax cannot install its repair '{self.name}': fairseq {version} has no "
                    f"{replacement.symbol} (it was written against fairseq {FAIRSEQ_VERSION})"
                )
            owners.append(owner)
        for owner, replacement in zip(owners, self.replacements):
            # A class attribute inherited from a base class is deleted again on uninstall,
            # not copied onto the subclass.
            own = replacement.attribute in vars(owner)
            original = getattr(owner, replacement.attribute) if not own else vars(owner)[replacement.attribute]
            setattr(owner, replacement.attribute, replacement.make(original))
            self._originals.append((owner, replacement.attribute, own, original))
        if self.on_install:
            self.on_install()

    def uninstall(self):
        """Put back what install replaced (a no-op when not installed)."""
        if not self.installed:
            return
        if self.on_uninstall:
            self.on_uninstall()
        for owner, attribute, own, original in reversed(self._originals):
            if own:
                setattr(owner, attribute, original)
            else:
                delattr(owner, attribute)
        self._originals.clear()

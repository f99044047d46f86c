# The dependency graph of one system's packages (name -> { dependencies, ... }).
rec {
  # Every package reachable from `names`, the names themselves included, sorted.
  closure =
    packages: names:
    builtins.sort builtins.lessThan (
      map (x: x.key) (
        builtins.genericClosure {
          startSet = map (key: { inherit key; }) names;
          operator = x: map (key: { inherit key; }) (packages.${x.key}.dependencies or [ ]);
        }
      )
    );

  # Everything `name` needs at run time, itself excluded: the wheels whose libraries its ELF
  # files may link against.
  dependencyClosure = packages: name: closure packages (packages.${name}.dependencies or [ ]);

  # { package = [ names it depends on that the set lacks ]; } for packages with any.
  missingDependencies =
    packages:
    let
      missing = builtins.mapAttrs (_: p: builtins.filter (d: !(packages ? ${d})) p.dependencies) packages;
    in
    removeEmpty missing;

  # Packages that reach themselves: buildPythonPackage cannot express a cycle, so the overlay
  # refuses a lock with any (it would otherwise recurse forever).
  cyclic =
    packages:
    builtins.filter (name: builtins.elem name (dependencyClosure packages name)) (
      builtins.attrNames packages
    );

  removeEmpty =
    attrs:
    builtins.listToAttrs (
      map (name: {
        inherit name;
        value = attrs.${name};
      }) (builtins.filter (name: attrs.${name} != [ ]) (builtins.attrNames attrs))
    );
}
